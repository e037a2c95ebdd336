"""The batches service: create (checking every line of the input file), get, list and
cancel. The scheduler's batch feed (`scheduler.batch_feed`) runs what is created here;
both keep batches in Redis through `jobstore.batch_store`.

A line is checked as its endpoint's route would check it (`api.openai.batch_lines`) and
routed to its pipeline (`JobService.validate`). A bad line becomes a line of the error
file, naming its line number and the field; it never fails the batch. Only a file that
cannot be read as JSONL, has no line, or has more than `batches.max_lines` fails the
batch as a whole.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Iterator

import anyio
import redis.asyncio as aredis

from api.file_service import FileService
from api.openai.batch_lines import body_field, bounded_lines, custom_id_of, parse_line
from api.service import JobService
from jobs.errors import Conflict, InputError, NotFound, TooLarge
from jobs.models import JobCreate, WebhookSpec
from jobs.settings import Settings
from jobstore.batch_records import ENDPOINTS, Batch, BatchStatus, Line, invalid_line, window_seconds
from jobstore.batch_store import AsyncBatchStore
from security.echo import clip

CHECK_EVERY = 200
"""Lines checked in a worker thread per step (the event loop runs between steps)."""
PUSH_EVERY = 1000


Checked = tuple[Line, JobCreate] | str
"""A line checked: its `Line` and job, or its line of the error file."""


def _take(items: Iterator[Checked], n: int) -> list[Checked]:
    return list(itertools.islice(items, n))


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


class BatchService:
    def __init__(
        self, settings: Settings, client: aredis.Redis, files: FileService, jobs: JobService
    ) -> None:
        self.settings = settings
        self.store = AsyncBatchStore(client, settings.job_ttl_s)
        self.files = files
        self.jobs = jobs

    async def create(
        self,
        owner: str,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
        webhook: WebhookSpec | None = None,
    ) -> Batch:
        if endpoint not in ENDPOINTS:
            raise InputError("endpoint", f"must be one of {list(ENDPOINTS)}")
        window_s = window_seconds(completion_window)
        if window_s is None:
            raise InputError("completion_window", "must be 24h (or shorter: 90s, 30m, 2h)")
        if webhook is not None:
            await self.jobs.check_webhook(webhook.url)
        source = await self.files.get_object(owner, input_file_id)
        if source.purpose != "batch":
            raise InputError("input_file_id", f"is a file of purpose {source.purpose!r}, not batch")
        now = time.time()
        batch = Batch(
            id=new_batch_id(),
            owner=owner,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + window_s,
            metadata=metadata or {},
            webhook=webhook,
        )
        await self.store.save(batch, index=True)
        limits = self.settings.batches
        try:
            count = await self._count_lines(source.key)
            if not count:
                return await self._fail(batch, "empty_file", "the input file has no line")
            if count > limits.max_lines:
                message = f"the input file has {count} lines, over {limits.max_lines}"
                return await self._fail(batch, "too_many_lines", message)
            _info, chunks = await self.files.open(source.key)
        except NotFound:
            return await self._fail(batch, "file_not_found", "the input file is gone")
        await self._check_lines(batch, chunks)
        await self.store.set_counts(batch.id, count, batch.failed)
        # In progress unless it was canceled meanwhile; either way the scheduler takes it
        # on from here.
        started = {"status": str(BatchStatus.IN_PROGRESS), "in_progress_at": repr(time.time())}
        await self.store.set_if(batch.id, [BatchStatus.VALIDATING], started)
        await self.store.activate(batch.id)
        return await self.get(batch.owner, batch.id)

    async def _count_lines(self, key: str) -> int:
        """The file's lines, counted in a worker thread as it is read (no line held whole
        past `batches.max_line_bytes`); `TooLarge` over `storage.max_upload_bytes`."""
        max_bytes = self.settings.storage.max_upload_bytes
        info, chunks = await self.files.open(key)
        if info.size_bytes > max_bytes:
            raise TooLarge("input_file_id", f"is {info.size_bytes} bytes, over {max_bytes}")
        lines = bounded_lines(chunks, self.settings.batches.max_line_bytes)
        return await anyio.to_thread.run_sync(lambda: sum(1 for _ in lines))

    async def _check_lines(self, batch: Batch, chunks: Iterator[bytes]) -> None:
        """Each line to the waiting lines or, if it is bad, to the error file: read and
        checked in a worker thread, `CHECK_EVERY` lines a step, so that a large file or a
        large line never holds the event loop."""
        checked = self._checked(batch, bounded_lines(chunks, self.settings.batches.max_line_bytes))
        good: list[str] = []
        bad: list[str] = []
        while step := await anyio.to_thread.run_sync(_take, checked, CHECK_EVERY):
            for outcome in step:
                if isinstance(outcome, str):
                    bad.append(outcome)
                    continue
                line, create = outcome
                try:
                    await self.files.check_input_refs(batch.owner, create.kind, create.input)
                except InputError as exc:
                    field = body_field(batch.endpoint, exc.field)
                    message = f"line {line.line}: {field}: {exc.reason}"
                    bad.append(invalid_line(batch.id, line.line, line.custom_id, exc.code, message))
                else:
                    good.append(line.model_dump_json())
            if len(good) >= PUSH_EVERY:
                await self.store.add_lines(batch.id, good, [])
                good.clear()
        await self.store.add_lines(batch.id, good, bad)
        batch.failed = len(bad)

    def _checked(self, batch: Batch, lines: Iterator[bytes | int]) -> Iterator[Checked]:
        """Each line checked (in a worker thread): its `Line` and job, or its error line."""
        seen: set[str] = set()
        max_bytes = self.settings.batches.max_line_bytes
        for number, raw in enumerate(lines, start=1):
            if isinstance(raw, int):
                message = (
                    f"line {number}: line: is {raw} bytes, over {max_bytes} "
                    "(batches.max_line_bytes)"
                )
                yield invalid_line(batch.id, number, None, TooLarge.code, message)
                continue
            try:
                custom_id, create, answer = parse_line(raw, batch.endpoint)
                if custom_id in seen:
                    raise InputError("custom_id", f"{clip(custom_id)} is used by an earlier line")
                seen.add(custom_id)
                try:
                    pipeline, _request, normalised = self.jobs.validate(create)
                except InputError as exc:
                    raise type(exc)(body_field(batch.endpoint, exc.field), exc.reason) from None
            except InputError as exc:
                message = f"line {number}: {exc.field}: {exc.reason}"
                yield invalid_line(batch.id, number, custom_id_of(raw), exc.code, message)
            else:
                job = {"kind": create.kind, "input": normalised, "metadata": create.metadata}
                line = Line(
                    line=number, custom_id=custom_id, pipeline=pipeline, job=job, answer=answer
                )
                yield line, create

    async def _fail(self, batch: Batch, code: str, message: str) -> Batch:
        batch.status = BatchStatus.FAILED
        batch.failed_at = time.time()
        batch.errors = [{"code": code, "message": message, "param": "input_file_id"}]
        await self.store.save(batch)
        if batch.webhook is not None:  # the scheduler calls it and forgets the batch
            await self.store.activate(batch.id)
        return batch

    async def get(self, owner: str | None, batch_id: str) -> Batch:
        """The batch, if it is `owner`'s (None: anyone's, for an admin)."""
        batch = await self.store.get(batch_id)
        if batch is None or (owner is not None and batch.owner != owner):
            raise NotFound(f"no batch {clip(batch_id)}")
        return batch

    async def page(
        self, owner: str | None, limit: int, after: str | None
    ) -> tuple[list[Batch], bool]:
        """`owner`'s batches (None: every owner's, for an admin), newest first, after the
        one named `after`; and whether there are more."""
        return await self.store.page(owner, limit, after)

    async def cancel(self, owner: str | None, batch_id: str) -> Batch:
        """Stop releasing its lines; the scheduler lets the running ones end, writes
        what finished and ends it `cancelled`."""
        batch = await self.get(owner, batch_id)
        if batch.status in {BatchStatus.CANCELLING, BatchStatus.CANCELLED}:
            return batch
        if batch.status.ended or batch.status is BatchStatus.FINALIZING:
            raise Conflict(f"batch {batch_id} has already ended ({batch.status})")
        cancelling = {"status": str(BatchStatus.CANCELLING), "cancelling_at": repr(time.time())}
        # Only a batch in progress (or validating) goes to cancelling: the scheduler may be
        # finalizing it this moment.
        sources = [BatchStatus.IN_PROGRESS, BatchStatus.VALIDATING]
        await self.store.set_if(batch_id, sources, cancelling)
        return await self.get(owner, batch_id)
