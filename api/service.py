"""The jobs service: the one narrow interface the routes use (submit, get, list, cancel, wait)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, NamedTuple

from celery import Celery
from pydantic import ValidationError

from api.files import FileService
from api.hub import EventHub
from jobs import keys
from jobs.broker import job_message
from jobs.codec import dumps, job_from_fields
from jobs.errors import Conflict, InputError, NotFound, QueueFull
from jobs.models import EventType, Job, JobCreate
from jobs.netguard import NetPolicy, check_url
from jobs.queues import pipeline_for
from jobs.schemas import schema_for, validation_error_field
from jobs.schemas.base import JobInput
from jobs.settings import Settings
from jobs.states import JobStatus
from jobs.store import ALL_FIELDS, AsyncJobStore, Lease, transition


class Validated(NamedTuple):
    pipeline: str
    """The pipeline that runs the job (its queue)."""
    request: JobInput
    input: dict[str, Any]
    """The input as stored: validated, with defaults filled in."""


@contextlib.contextmanager
def _fields_of(parent: str) -> Iterator[None]:
    """Prefix the field of an `InputError` raised inside with `parent.`."""
    try:
        yield
    except InputError as exc:
        raise type(exc)(f"{parent}.{exc.field}", exc.reason) from None


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def body_hash(body: JobCreate) -> str:
    return hashlib.sha256(dumps(body.model_dump(mode="json")).encode()).hexdigest()


class JobService:
    def __init__(
        self,
        settings: Settings,
        store: AsyncJobStore,
        celery: Celery,
        hub: EventHub,
        files: FileService | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.celery = celery
        self.hub = hub
        self.files = files
        """Checks the file references of an input at submit and notes the uploads used."""

    def validate(self, body: JobCreate) -> Validated:
        """Validate the input against its kind and choose the pipeline that runs it."""
        try:
            schema = schema_for(body.kind, self.settings)
        except KeyError:
            raise InputError("kind", f"unknown kind {body.kind!r}") from None
        try:
            request = schema.model_validate(body.input)
        except ValidationError as exc:
            raise validation_error_field(exc, "input") from None
        with _fields_of("input"):
            request.check_limits(self.settings.limits)
        pipeline = pipeline_for(self.settings, body.kind, request.model)
        with _fields_of("input"):
            request.check_pipeline(self.settings.pipelines[pipeline])
        pipeline = request.route(pipeline, self.settings)
        return Validated(pipeline, request, request.model_dump(mode="json"))

    async def submit(
        self,
        owner: str,
        body: JobCreate,
        idempotency_key: str | None = None,
        job_id: str | None = None,
    ) -> tuple[Job, bool]:
        """Store and enqueue a job; returns (job, created). Raises QueueFull, InputError."""
        pipeline, request, normalised = self.validate(body)
        cached = await self._cached_output(owner, pipeline, request)
        used = await self.files.check_input_refs(owner, body.kind, body.input) if self.files else []
        if body.webhook is not None:
            await self._check_webhook(body.webhook.url)
        now = time.time()
        job = Job(
            id=job_id or new_job_id(),
            kind=body.kind,
            pipeline=pipeline,
            status=JobStatus.QUEUED,
            owner=owner,
            priority=body.priority,
            input=normalised,
            metadata=body.metadata,
            webhook=body.webhook,
            created_at=now,
            queued_at=now,
        )
        digest = body_hash(body) if idempotency_key else ""
        result = await self.store.submit(
            job,
            max_queued=self.settings.queue.limit_for(body.kind),
            idempotency=(idempotency_key, digest) if idempotency_key else None,
            # Stored and queued in one script: a job never exists without its message.
            message=None if cached is not None else job_message(self.celery, job),
        )
        if result.outcome == "dup":
            if result.body_hash != digest:
                raise InputError(
                    "Idempotency-Key", "was already used with a different request body"
                )
            return await self.get(owner, result.job_id), False
        if result.outcome == "full":
            raise QueueFull(
                f"the {body.kind} queue is full ({self.settings.queue.limit_for(body.kind)} "
                "jobs waiting); retry later",
                self.settings.api.retry_after_s,
            )
        if used and self.files is not None:
            await self.files.note_used(used, job.id)
        if cached is not None:
            return await self._answer_from_cache(job, cached), True
        return job, True

    async def _cached_output(
        self, owner: str, pipeline: str, request: JobInput
    ) -> dict[str, Any] | None:
        """The response cache's answer to a deterministic request, if it has one."""
        policy = request.cache_policy(self.settings.pipelines[pipeline])
        if policy is None:
            return None
        raw = await self.store.r.get(keys.response_cache(owner, policy.digest))
        return None if raw is None else {**json.loads(raw), "cached": True}

    async def _answer_from_cache(self, job: Job, output: dict[str, Any]) -> Job:
        """End a new job with a cached answer, through the usual transitions (it runs
        here, under a lease of its own, instead of on a worker)."""
        lease = Lease(token=f"response-cache:{secrets.token_hex(8)}", ttl_ms=30_000)
        started = await self.store.apply(
            transition(
                job,
                JobStatus.RUNNING,
                sources=frozenset({JobStatus.QUEUED}),
                lease_mode="acquire",
                lease=lease,
                fields={"started_at": repr(time.time()), "worker": "response-cache"},
            )
        )
        if started.ok:
            end = transition(
                job,
                JobStatus.SUCCEEDED,
                sources=frozenset({JobStatus.RUNNING}),
                lease_mode="check",
                lease=lease,
                fields={"output": dumps(output), "finished_at": repr(time.time())},
                pre_event=(EventType.OUTPUT, output),
            )
            ended = await self.store.apply(replace(end, read_back=ALL_FIELDS))
            if ended.ok:
                return job_from_fields(ended.read_back)
        return await self.get(job.owner, job.id)

    async def _check_webhook(self, url: str) -> None:
        if not self.settings.webhooks.secret:
            raise InputError("webhook", "webhooks are not enabled here (no signing secret)")
        policy = NetPolicy.from_settings(self.settings.net)
        await asyncio.to_thread(check_url, url, "webhook.url", policy)

    async def deliveries(self, owner: str, job_id: str) -> list[dict[str, object]]:
        await self.get(owner, job_id)
        return await self.store.deliveries(job_id)

    async def get(self, owner: str, job_id: str) -> Job:
        """The job, or NotFound when it does not exist or belongs to another owner."""
        job = await self.store.get(job_id)
        if job is None or job.owner != owner:
            raise NotFound(f"no job {job_id!r}")
        return job

    async def cancel(self, owner: str, job_id: str) -> Job:
        job = await self.get(owner, job_id)
        if job.status.terminal:
            raise Conflict(f"job {job_id} has already ended ({job.status})")
        await self.store.request_cancel(job_id)
        if job.status is JobStatus.QUEUED:
            await self.store.apply(
                transition(
                    job,
                    JobStatus.CANCELED,
                    sources=frozenset({JobStatus.QUEUED}),
                    fields={"finished_at": repr(time.time())},
                )
            )
        return await self.get(owner, job_id)

    async def submit_and_wait(
        self, owner: str, body: JobCreate, idempotency_key: str | None, timeout_s: float
    ) -> Job:
        """Submit, then wait up to `timeout_s` for the end; subscribed before the job
        exists, so no notice can be missed and the new job needs no second read."""
        job_id = new_job_id()
        async with self.hub.subscribe(job_id, ends_only=True) as notices:
            job, created = await self.submit(owner, body, idempotency_key, job_id=job_id)
            if not created:
                return await self.wait(owner, job.id, timeout_s)
            return await self._wait_on(owner, job, notices, timeout_s)

    async def wait(self, owner: str, job_id: str, timeout_s: float) -> Job:
        """The job once it has ended, or as it is after `timeout_s`."""
        async with self.hub.subscribe(job_id, ends_only=True) as notices:
            return await self._wait_on(owner, await self.get(owner, job_id), notices, timeout_s)

    async def _wait_on(
        self, owner: str, job: Job, notices: asyncio.Queue[dict[str, Any]], timeout_s: float
    ) -> Job:
        timeout_s = max(0.0, min(timeout_s, self.settings.api.max_wait_s))
        deadline = time.monotonic() + timeout_s
        job_id = job.id
        while not job.status.terminal:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    notice = await notices.get()
            except TimeoutError:
                break
            # Only the end and RESYNC come here (`ends_only`); the end carries the job
            # unless it is large.
            fields = notice.get("job")
            job = job_from_fields(fields) if fields else await self.get(owner, job_id)
        return job

    async def list(
        self,
        owner: str,
        *,
        status: JobStatus | None,
        kind: str | None,
        limit: int,
        cursor: str | None,
    ) -> tuple[list[Job], str | None]:
        """The owner's jobs, newest first, filtered; returns (page, next cursor)."""
        max_score, after_id = decode_cursor(cursor) if cursor else ("+inf", None)
        page: list[Job] = []
        scanned = 0
        while len(page) < limit and scanned < 20 * limit + 100:
            rows = await self.store.list_ids(owner, max_score, limit + 50)
            if after_id is not None:
                rows = [r for r in rows if not (r[1] == float(max_score) and r[0] >= after_id)]
            if not rows:
                return page, None
            jobs = await self.store.get_many([job_id for job_id, _ in rows])
            await self.store.forget(
                owner, [r[0] for r, j in zip(rows, jobs, strict=True) if j is None]
            )
            for (job_id, score), job in zip(rows, jobs, strict=True):
                scanned += 1
                max_score, after_id = repr(score), job_id
                if job is None or (status and job.status != status) or (kind and job.kind != kind):
                    continue
                page.append(job)
                if len(page) == limit:
                    return page, encode_cursor(score, job_id)
        return page, (encode_cursor(float(max_score), after_id) if after_id else None)


def encode_cursor(score: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([score, job_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        score, job_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return repr(float(score)), str(job_id)
    except (ValueError, TypeError) as exc:
        raise InputError("cursor", "is not a cursor this API returned") from exc
