"""The jobs service: the one door through which routes reach jobs.

Submit, get, list, cancel, wait for the end, follow the events, webhook deliveries, and
the files that inputs name. Routes hold this service (through FastAPI dependencies),
never the Redis client, the store, the hub or Celery.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
import time
from collections.abc import Iterator
from typing import NamedTuple

from celery import Celery
from pydantic import JsonValue, ValidationError

from api import event_feed, ratelimit
from api.cache import ResponseCache
from api.file_service import FileService
from api.hub import Ends, EventHub
from api.listing import JobFilter, list_jobs
from broker.celery_app import job_message
from broker.queues import pipeline_for
from jobs.errors import Conflict, InputError, MmqError, NotFound, QueueFull, QuotaExceeded
from jobs.models import Job, JobCreate
from jobs.schemas import schema_for, validation_error_field
from jobs.schemas.base import JobInput
from jobs.settings import COST_UNITS, Settings
from jobs.states import JobStatus
from jobstore import operations, quotas
from jobstore.changes import SubmitResult
from jobstore.codec import dumps, job_from_fields
from jobstore.job_indexes import jobs_of
from jobstore.quotas import Quota
from jobstore.store import AsyncJobStore
from security.netguard import NetPolicy, check_url
from telemetry import tracing

WEBHOOKS_OFF = (
    "webhooks are not enabled here: the deployment signs them with webhooks.secret "
    "(MMQ_WEBHOOKS__SECRET), which is not set; a receiver on a private or loopback address "
    "also needs net.allow_private_addresses (MMQ_NET__ALLOW_PRIVATE_ADDRESSES=true)"
)
"""A job's webhook where the deployment has no signing secret: the two settings a local
receiver needs, named at once."""


class OpenStreams:
    """The streams that follow a job for a client now (`api.streaming`), counted so that
    the API's shutdown waits for their clean-up (a streamed completion's cancel) before it
    closes its Redis connections: uvicorn cancels the streams still open at the end of
    `api.shutdown_grace_s` and starts the shutdown at once."""

    def __init__(self) -> None:
        self._open = 0
        self._none = asyncio.Event()
        self._none.set()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._open += 1
        self._none.clear()
        try:
            yield
        finally:
            self._open -= 1
            if not self._open:
                self._none.set()

    async def closed(self, timeout_s: float) -> bool:
        """Wait until none is open, up to `timeout_s`; whether none is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none.wait(), timeout_s)
        return not self._open


class Validated(NamedTuple):
    pipeline: str
    """The pipeline that runs the job (its queue)."""
    request: JobInput
    input: dict[str, JsonValue]
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


def deadline_of(body: JobCreate, pipeline_max_queue_s: float | None, now: float) -> float | None:
    """The job's deadline (unix seconds): the earlier of the request's `deadline` and its
    `max_queue_s` from now (the pipeline's where the request gives none); None for none.
    InputError for a deadline already past, or `cancel_at_deadline` without a deadline."""
    found = []
    if body.deadline is not None:
        at = body.deadline.timestamp()
        if at <= now:
            raise InputError("deadline", "is in the past")
        found.append(at)
    wait_s = body.max_queue_s if body.max_queue_s is not None else pipeline_max_queue_s
    if wait_s is not None:
        found.append(now + wait_s)
    if body.cancel_at_deadline and not found:
        raise InputError("cancel_at_deadline", "needs a deadline or max_queue_s")
    return min(found) if found else None


class JobService:
    def __init__(
        self,
        settings: Settings,
        store: AsyncJobStore,
        celery: Celery,
        hub: EventHub,
        files: FileService,
        cache: ResponseCache,
    ) -> None:
        self.settings = settings
        self.files = files
        """Uploads, downloads and deletes of files, and the file references of inputs."""
        self._store = store
        self._celery = celery
        self._hub = hub
        self._cache = cache
        self.streams = OpenStreams()
        """Open follows of jobs for clients (`api.streaming`)."""

    def validate(self, body: JobCreate, validated: JobInput | None = None) -> Validated:
        """Validate the input against its kind and choose the pipeline that runs it.
        `validated`: the input as a route validated it already (an OpenAI request's, which
        is `body.input`), checked against the deployment here but not validated again."""
        try:
            schema = schema_for(body.kind, self.settings)
        except KeyError:
            raise InputError("kind", f"unknown kind {body.kind!r}") from None
        if validated is not None and isinstance(validated, schema):
            request = validated
        else:
            try:
                with _fields_of("input"):  # a field an OpenAI body does not carry
                    request = schema.model_validate(body.input)
            except ValidationError as exc:
                raise validation_error_field(exc, "input") from None
        with _fields_of("input"):
            request.check_limits(self.settings.limits)
        pipeline = pipeline_for(self.settings, body.kind, request.model)
        with _fields_of("input"):
            request.check_pipeline(self.settings.pipelines[pipeline])
        pipeline = request.route(pipeline, self.settings)
        return Validated(pipeline, request, request.record())

    async def submit(
        self,
        owner: str,
        body: JobCreate,
        idempotency_key: str | None = None,
        job_id: str | None = None,
        validated: JobInput | None = None,
    ) -> tuple[Job, bool]:
        """Store and enqueue a job; returns (job, created). Raises QueueFull, InputError.
        `validated`: its input as the route validated it (`validate`). Traced as its
        admission (`mmq.admit`) where tracing is on."""
        job_id = job_id or new_job_id()
        if not tracing.enabled():
            return await self._submit(owner, body, idempotency_key, job_id, validated)
        attributes = {"mmq.job_id": job_id, "mmq.kind": body.kind, "mmq.owner": owner}
        with tracing.admission(attributes) as admitted:
            try:
                job, created = await self._submit(owner, body, idempotency_key, job_id, validated)
            except MmqError as exc:
                tracing.failed(admitted, f"{exc.code}: {exc}")
                raise
            if admitted is not None:
                admitted.set_attribute("mmq.pipeline", job.pipeline)
            return job, created

    async def _submit(
        self,
        owner: str,
        body: JobCreate,
        idempotency_key: str | None,
        job_id: str,
        validated: JobInput | None,
    ) -> tuple[Job, bool]:
        pipeline, request, normalised = self.validate(body, validated)
        cached = await self._cache.lookup(owner, pipeline, request)
        used = await self.files.check_input_refs(owner, body.kind, body.input, request.file_refs())
        if body.webhook is not None:
            await self.check_webhook(body.webhook.url)
        now = time.time()
        deadline = deadline_of(body, self.settings.pipelines[pipeline].max_queue_s, now)
        job = Job(
            id=job_id,
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
            deadline=deadline,
            cancel_at_deadline=body.cancel_at_deadline,
            traceparent=tracing.current_traceparent(),
        )
        digest = body_hash(body) if idempotency_key else ""
        result = await self._store.submit(
            job,
            max_queued=self.settings.queue.limit_for(body.kind),
            idempotency=(idempotency_key, digest) if idempotency_key else None,
            # Stored and queued in one script: a job never exists without its message.
            message=None if cached is not None else job_message(self._celery, job),
            cost=request.cost(),
        )
        if result.outcome == "dup":
            if result.body_hash != digest:
                raise InputError(
                    "Idempotency-Key", "was already used with a different request body"
                )
            return await self.get(owner, result.job_id), False
        if result.outcome == "quota":
            raise self._over_quota(owner, body.kind, request.cost(), result, now)
        if result.outcome == "ok":
            self._note_admitted(body.kind, result, now)
        if result.outcome == "full":
            raise QueueFull(
                f"the {body.kind} queue is full ({self.settings.queue.limit_for(body.kind)} "
                "jobs waiting); retry later",
                self.settings.api.retry_after_s,
            )
        await self.files.note_used(used, job.id)
        if cached is not None:
            return await self._cache.answer(job, cached) or await self.get(owner, job.id), True
        return job, True

    @property
    def _window_s(self) -> int:
        return self.settings.quotas.window_s

    def _note_admitted(self, kind: str, result: SubmitResult, now: float) -> None:
        """The rate-limit headers of an admitted submit: its key's requests, and its
        tokens where the kind's cost is counted in tokens (LLM, embeddings)."""
        if result.limit:
            ratelimit.note(ratelimit.Usage(result.limit, result.used, self._window_s, now))
        if result.cost_limit and COST_UNITS.get(kind) == "tokens":
            usage = ratelimit.Usage(
                result.cost_limit, result.cost_used, self._window_s, now, name="tokens"
            )
            ratelimit.note(usage)

    def _over_quota(
        self, owner: str, kind: str, cost: int, result: SubmitResult, now: float
    ) -> QuotaExceeded:
        window_s, limit, used = self._window_s, result.limit, result.used
        wait_s = int(ratelimit.reset_after_s(window_s, now))
        if result.quota == "requests":
            ratelimit.note(ratelimit.Usage(limit, used, window_s, now))
            what = f"requests: {used} of {limit} in {window_s} s"
        elif result.quota == "cost":
            unit = COST_UNITS[kind]
            if unit == "tokens":
                ratelimit.note(ratelimit.Usage(limit, used, window_s, now, name="tokens"))
            if cost > limit:
                return QuotaExceeded(
                    f"the request alone costs {cost} {unit} ({kind}), over the key "
                    f"{owner!r}'s quota of {limit} per {window_s} s: make it smaller",
                    wait_s, f"cost.{kind}",
                )  # fmt: skip
            what = f"{kind} {unit}: {used} of {limit} in {window_s} s (this request: {cost})"
        else:
            wait_s = self.settings.api.retry_after_s
            what = f"jobs queued: {used} of {limit}"
        return QuotaExceeded(
            f"the key {owner!r} is over its quota of {what}; retry later", wait_s, result.quota
        )

    async def quota(self, owner: str) -> Quota:
        """The key's limits in effect and what it uses now."""
        window = int(time.time() // self._window_s)
        found = await self._store.quota_state(owner, window)
        return quotas.from_reads(self.settings.quotas, found, owner)

    async def set_limits(self, owner: str, limits: quotas.KeyLimits) -> Quota:
        await self._store.set_limits(owner, quotas.own_fields(limits))
        return await self.quota(owner)

    async def note_usage(self, owner: str) -> None:
        """The key's requests this window, for the rate-limit headers (where it has a
        requests quota)."""
        now = time.time()
        quota = await self.quota(owner)
        if quota.requests:
            ratelimit.note(
                ratelimit.Usage(quota.requests, quota.requests_used, quota.window_s, now)
            )

    async def check_webhook(self, url: str) -> None:
        """InputError unless webhooks are on and `url` may be called."""
        if not self.settings.webhooks.secret:
            raise InputError("webhook", WEBHOOKS_OFF)
        policy = NetPolicy.from_settings(self.settings.net)
        await asyncio.to_thread(check_url, url, "webhook.url", policy)

    async def deliveries(self, owner: str, job_id: str) -> list[dict[str, object]]:
        await self.get(owner, job_id)
        return await self._store.deliveries(job_id)

    async def owner_of(self, job_id: str) -> str | None:
        """Whose job `job_id` is (None: no such job)."""
        return await self._store.owner_of(job_id)

    async def get(self, owner: str, job_id: str) -> Job:
        """The job, or NotFound when it does not exist or belongs to another owner."""
        job = await self._store.get(job_id)
        if job is None or job.owner != owner:
            raise NotFound(f"no job {job_id!r}")
        return job

    async def cancel(self, owner: str, job_id: str) -> Job:
        job = await self.get(owner, job_id)
        if job.status.terminal:
            raise Conflict(f"job {job_id} has already ended ({job.status})")
        await self._store.request_cancel(job_id)
        if job.status is JobStatus.QUEUED:
            await self._store.apply(operations.cancel_queued(job))
        return await self.get(owner, job_id)

    async def submit_and_wait(
        self, owner: str, body: JobCreate, idempotency_key: str | None, timeout_s: float
    ) -> Job:
        """Submit, then wait up to `timeout_s` for the end; subscribed before the job
        exists, so no notice can be missed and the new job needs no second read."""
        job_id = new_job_id()
        async with self._hub.subscribe_ends(job_id) as notices:
            job, created = await self.submit(owner, body, idempotency_key, job_id=job_id)
            if not created:
                return await self.wait(owner, job.id, timeout_s)
            return await self._wait_on(owner, job, notices, timeout_s)

    async def wait(self, owner: str, job_id: str, timeout_s: float) -> Job:
        """The job once it has ended, or as it is after `timeout_s`."""
        async with self._hub.subscribe_ends(job_id) as notices:
            return await self._wait_on(owner, await self.get(owner, job_id), notices, timeout_s)

    async def _wait_on(self, owner: str, job: Job, notices: Ends, timeout_s: float) -> Job:
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

    async def list_all(
        self, keep: JobFilter, *, limit: int, cursor: str | None
    ) -> tuple[list[Job], str | None]:
        """Every owner's jobs (for admins), newest first, filtered."""
        return await list_jobs(self._store, jobs_of(None), keep, limit=limit, cursor=cursor)

    async def get_any(self, job_id: str) -> Job:
        """The job whoever owns it (for admins), or NotFound."""
        job = await self._store.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        return job

    async def retry(self, owner: str, job_id: str) -> Job:
        """A new job of `owner` with the ended job's kind, input, priority, metadata and
        webhook (validated and routed again, as any submit; a deadline is not carried
        over: the pipeline's `max_queue_s` applies). Conflict while it has not
        ended; QueueFull as a submit."""
        job = await self.get(owner, job_id)
        if not job.status.terminal:
            raise Conflict(f"job {job_id} has not ended ({job.status}); cancel it or wait")
        body = JobCreate(
            kind=job.kind,
            input=job.input,
            priority="low" if job.priority == "batch" else job.priority,
            metadata=job.metadata,
            webhook=job.webhook,
        )
        new, _created = await self.submit(owner, body)
        return new

    async def list(
        self, owner: str, keep: JobFilter, *, limit: int, cursor: str | None
    ) -> tuple[list[Job], str | None]:
        """The owner's jobs, newest first, filtered; returns (page, next cursor)."""
        return await list_jobs(self._store, jobs_of(owner), keep, limit=limit, cursor=cursor)

    async def submit_following(
        self,
        owner: str,
        body: JobCreate,
        job_id: str | None = None,
        validated: JobInput | None = None,
    ) -> tuple[Job, event_feed.Batches]:
        """Store and enqueue a job, and follow its events from its first (`follow`), for a
        route that streams the job it submits: the job is joined in the hub before it is
        stored, so nothing is read back from Redis (no owner check, no replay). `job_id`:
        one the route made (`new_job_id`), where it names the job before submitting it;
        `validated`: its input as the route validated it."""
        job_id = job_id or new_job_id()
        joined = await self._hub.join(job_id)
        try:
            job, _created = await self.submit(owner, body, job_id=job_id, validated=validated)
        except BaseException:
            self._hub.leave(job_id, joined)
            raise
        return job, event_feed.follow(self._store, self._hub, job_id, None, joined)

    async def follow(self, owner: str, job_id: str, after: str | None) -> event_feed.Batches:
        """The job's events after `after` (all of them when None), replayed and then live
        until its terminal status event, in batches (those that arrived together), with
        None for a keep-alive (`api.event_feed.follow`).
        Raises NotFound here, before any event, unless the job is `owner`'s."""
        if await self._store.owner_of(job_id) != owner:  # one field read, not the whole job
            raise NotFound(f"no job {job_id!r}")
        return event_feed.follow(self._store, self._hub, job_id, after)
