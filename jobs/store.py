"""The Redis job store: a hash per job, an owner index, leases, events.

`JobStore` (sync: workers, reaper, CLI) and `AsyncJobStore` (the API) share the Lua
scripts and the argument builders below, so a transition is written in one place.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Self

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from jobs import keys, lua, redis_client
from jobs.codec import (
    dumps,
    event_from_entry,
    flat_pairs,
    job_from_fields,
    job_to_fields,
    text_list,
    text_map,
    time_seconds,
)
from jobs.durability import Durability
from jobs.kombu_redis import PRIORITY_VALUES, TaskMessage
from jobs.models import Event, EventType, Job, WebhookSpec
from jobs.schemas.base import CachePolicy
from jobs.settings import Settings
from jobs.states import JobStatus, allowed_sources, check_transition
from jobs.webhooks import wants

LeaseMode = Literal["", "check", "absent", "acquire"]

ALL_FIELDS = ("*",)
"""`Transition.read_back` for every field of the job."""

EventListener = Callable[[str, str, dict[str, Any]], None]
"""(job_id, webhook url, event) -> None: hands an event to webhook delivery."""

log = logging.getLogger("mmq.store")


@dataclass(frozen=True)
class Lease:
    token: str
    ttl_ms: int


@dataclass
class TransitionResult:
    ok: bool
    reason: str = ""
    pre_event_id: str = ""
    """On failure: `missing`, `status`, `lease`, `canceled` or `expired`."""
    status: str = ""
    """On failure: the status the job had."""
    event_id: str = ""
    read_back: dict[str, str] = field(default_factory=dict)
    """On success: the fields named in `Transition.read_back`, as they are after it
    ('' for a field the job does not have)."""
    held: list[tuple[str, str]] = field(default_factory=list)
    """(channel, message) of the notices the script held back (`Transition.hold`), for
    the caller to publish once the writes are confirmed."""


@dataclass(frozen=True)
class NewEvent:
    """An event of a running job, to append to its stream (`JobStore.append_events`)."""

    job_id: str
    type: EventType
    data: dict[str, Any]
    first_output: bool = False
    """Whether it is an output (partial or progress): the job's first one sets its
    `first_output_at`."""
    webhook: WebhookSpec | None = None
    ts: float = field(default_factory=time.time)
    lease_token: str = ""
    """The lease of the run that made it ('' for none): the event is written only while
    its job still has that lease (an abandoned run's late events are dropped)."""


@dataclass
class SubmitResult:
    outcome: Literal["ok", "dup", "full", "quota"]
    job_id: str = ""
    body_hash: str = ""
    quota: str = ""
    """For `quota`: the one exceeded (`requests`, `queued`)."""
    limit: int = 0
    """For `ok`: the owner's requests limit (0: none); for `quota`: the exceeded one's."""
    used: int = 0
    """For `ok`: the owner's requests in this window, this one included; for `quota`:
    what it has of the exceeded one."""


@dataclass
class Transition:
    """Everything a status change writes: built once, run by either store."""

    job_id: str
    target: JobStatus
    sources: frozenset[JobStatus]
    fields: dict[str, str] = field(default_factory=dict)
    event_data: dict[str, Any] = field(default_factory=dict)
    lease_mode: LeaseMode = ""
    lease: Lease | None = None
    kind: str = ""
    pre_event: tuple[EventType, dict[str, Any]] | None = None
    """An output or error event written atomically just before the status event."""
    webhook: WebhookSpec | None = None
    read_back: tuple[str, ...] = ()
    """Fields the script returns after a successful change (no second read); `ALL_FIELDS`
    for the whole job."""
    message: TaskMessage | None = None
    """A requeue's task message, pushed by the same script (a queued job always has one)."""

    def webhook_after(self, result: TransitionResult) -> WebhookSpec | None:
        """The job's webhook: as given, else as read back with `ALL_FIELDS`."""
        if self.webhook is not None or self.read_back != ALL_FIELDS:
            return self.webhook
        raw = result.read_back.get("webhook")
        return WebhookSpec.model_validate_json(raw) if raw else None

    def written_events(self, result: TransitionResult, now: float) -> list[dict[str, Any]]:
        """The events a successful transition wrote, as dicts."""
        events = []
        if self.pre_event is not None:
            etype, data = self.pre_event
            events.append(_event(result.pre_event_id, self.job_id, str(etype), data, now))
        status = {"status": str(self.target), **self.event_data}
        events.append(_event(result.event_id, self.job_id, "status", status, now))
        return events

    def script_args(self, settings: Settings, now: float) -> tuple[list[str], list[str]]:
        """The transition script's keys and its one argument."""
        for source in self.sources:
            check_transition(source, self.target)
        key_list = [
            keys.job(self.job_id),
            keys.job_events(self.job_id),
            keys.lease(self.job_id),
            keys.RUNNING,
            keys.queued(self.kind),
            self.message.list_key if self.message else keys.job(self.job_id) + ":unused",
            keys.DEADLINES,
            keys.queued_batch(self.kind),
        ]
        change = {
            "job_id": self.job_id,
            "sources": sorted(self.sources),
            "target": str(self.target),
            "now": repr(now),
            "lease_mode": self.lease_mode,
            "lease_token": self.lease.token if self.lease else "",
            "lease_ttl_ms": self.lease.ttl_ms if self.lease else 0,
            "end_ttl_s": settings.job_ttl_s if self.target.terminal else 0,
            "maxlen": settings.events_maxlen,
            "channel": keys.EVENTS_CHANNEL,
            "ends_channel": keys.ENDS_CHANNEL,
            "event": dumps({"status": str(self.target), **self.event_data}),
            "pre_event_type": str(self.pre_event[0]) if self.pre_event else "",
            "pre_event": dumps(self.pre_event[1]) if self.pre_event else "",
            "read_back": list(self.read_back),
            "fields": self.fields,
            "message": self.message.envelope if self.message else "",
            # An end at a durable level: its notices (what SSE clients, waiting requests
            # and the hub hear) go out only once the caller has confirmed the writes.
            "hold": self.target.terminal and settings.redis.durability != "memory",
            "usage_prefix": keys.USAGE_PREFIX,
        }
        return key_list, [dumps(change)]


def transition(
    job: Job,
    target: JobStatus,
    *,
    fields: dict[str, str] | None = None,
    event_data: dict[str, Any] | None = None,
    lease_mode: LeaseMode = "",
    lease: Lease | None = None,
    sources: frozenset[JobStatus] | None = None,
    pre_event: tuple[EventType, dict[str, Any]] | None = None,
    message: TaskMessage | None = None,
) -> Transition:
    """A transition of `job` to `target` from any status the table allows (or `sources`)."""
    return Transition(
        job_id=job.id,
        target=target,
        sources=sources if sources is not None else allowed_sources(target),
        fields=fields or {},
        event_data=event_data or {},
        lease_mode=lease_mode,
        lease=lease,
        kind=job.kind,
        pre_event=pre_event,
        webhook=job.webhook,
        message=message,
    )


def _event(
    event_id: str, job_id: str, etype: str, data: dict[str, Any], ts: float
) -> dict[str, Any]:
    return {"id": event_id, "job_id": job_id, "type": etype, "data": data, "ts": ts}


def webhook_events(
    change: Transition, result: TransitionResult, now: float
) -> list[tuple[str, dict[str, Any]]]:
    """(webhook url, event) for each event of a transition that its job's webhook wants."""
    spec = change.webhook_after(result) if result.ok else None
    if spec is None:
        return []
    return [
        (spec.url, e)
        for e in change.written_events(result, now)
        if wants(spec.events, e["type"], e["data"])
    ]


def submit_args(
    job: Job,
    settings: Settings,
    *,
    max_queued: int,
    idempotency: tuple[str, str] | None = None,
    message: TaskMessage | None = None,
    counter: tuple[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """The submit script's keys and its one argument: store `job` queued unless its
    queued set holds `max_queued` (a batch line's is `keys.queued_batch`, which the 429
    bound never counts) or the Idempotency-Key was used, push its task `message` and
    count the submit in `counter` (hash key, field)."""
    idem_key, body_hash = idempotency or ("", "")
    unused = keys.job(job.id) + ":unused"
    batch_line = job.priority == "batch"
    queued = keys.queued_batch(job.kind) if batch_line else keys.queued(job.kind)
    quotas = settings.quotas
    window = int(job.created_at // quotas.window_s)
    key_list = [
        keys.job(job.id),
        keys.owner_jobs(job.owner),
        queued,
        keys.idempotency(job.owner, idem_key) if idem_key else unused,
        keys.job_events(job.id),
        message.list_key if message else unused,
        counter[0] if counter else unused,
        keys.ALL_JOBS,
        keys.DEADLINES,
        keys.LIMITS,
        keys.usage(job.owner),
        keys.requests_in(job.owner, window),
        keys.OWNERS,
    ]
    hold = None
    if settings.fairness.enabled and message is not None and not batch_line:
        mine = PRIORITY_VALUES[job.priority]
        above = [
            keys.holders(job.pipeline, p) if PRIORITY_VALUES[p] <= mine else unused
            for p in ("high", "normal", "low")
        ]
        key_list += [
            keys.room(job.pipeline),
            *above,
            keys.holders(job.pipeline, job.priority),
            keys.hold(job.pipeline, job.priority, job.owner),
            keys.passes(job.pipeline, job.priority),
            keys.HELD,
        ]
        entry = {"job_id": job.id, "list": message.list_key, "envelope": message.envelope}
        hold = {"entry": dumps(entry), "field": f"{job.pipeline}|{job.priority}"}
    submit = {
        "job_id": job.id,
        "max_queued": max_queued,
        "score": repr(job.created_at),
        "idem_ttl_s": settings.idempotency_ttl_s,
        "idem_value": f"{job.id}|{body_hash}" if idem_key else "",
        "maxlen": settings.events_maxlen,
        "channel": keys.EVENTS_CHANNEL,
        "event": dumps({"status": "queued"}),
        "ts": repr(job.created_at),
        "message": message.envelope if message else "",
        "counter_field": counter[1] if counter else "",
        "deadline": repr(job.deadline) if job.deadline is not None else "",
        "fields": flat_pairs(job_to_fields(job)),
        "quota": {
            "owner": job.owner,
            "counts": not batch_line,
            "max_queued": quotas.max_queued,
            "requests": quotas.requests,
            "window_ttl_s": 2 * quotas.window_s,
        },
    }
    if hold is not None:
        submit["hold"] = hold
    return key_list, [dumps(submit)]


def _decode_result(change: Transition, raw: list[Any]) -> TransitionResult:
    outcome, value = raw[0], raw[1]
    if outcome == "ok":
        if change.read_back == ALL_FIELDS:
            read_back = dict(zip(raw[4::2], raw[5::2], strict=True))
        else:
            read_back = dict(zip(change.read_back, raw[4:], strict=True))
        held = [(str(c), str(m)) for c, m in json.loads(raw[3])] if raw[3] else []
        return TransitionResult(
            ok=True, event_id=value, pre_event_id=raw[2], read_back=read_back, held=held
        )
    return TransitionResult(ok=False, reason=outcome, status=value)


def _events_from(job_id: str, entries: Any) -> list[Event]:
    """Events from an XRANGE reply (of a decoding client)."""
    return [event_from_entry(job_id, entry_id, fields) for entry_id, fields in entries or []]


def _after(after: str | None) -> str:
    return f"({after}" if after else "-"


class JobStore:
    """Synchronous store, for worker processes, the reaper and the CLI."""

    def __init__(
        self, client: redis.Redis, settings: Settings, on_event: EventListener | None = None
    ) -> None:
        self.r = client
        self.settings = settings
        self.on_event = on_event
        self._transition = client.register_script(lua.TRANSITION)
        self._submit = client.register_script(lua.SUBMIT)
        self.durability = Durability(settings.redis)
        self._append = client.register_script(lua.APPEND_EVENTS)
        self._renew = client.register_script(lua.RENEW_LEASE)
        self._give_back = client.register_script(lua.GIVE_BACK_LEASE)
        self._resend = client.register_script(lua.RESEND)

    @classmethod
    def connect(cls, settings: Settings, on_event: EventListener | None = None) -> Self:
        if not settings.redis_url:
            raise ValueError("redis_url is not set")
        # A command on a connection whose peer went silent (a partition) gives up after
        # this, so that a worker notices it cannot renew its leases; longer than any wait
        # it makes on purpose (the confirmation of an end, up to a lease).
        ttl_s = settings.lease.ttl_s
        wait_s = max(settings.redis.durability_timeout_ms / 1000, ttl_s)
        client = redis_client.connect(settings.redis_url, socket_timeout=wait_s + ttl_s)
        return cls(client, settings, on_event)

    def get(self, job_id: str) -> Job | None:
        fields = text_map(self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    def apply(self, change: Transition) -> TransitionResult:
        """Run the change; one that ends the job is confirmed at `redis.durability` before
        its webhooks are handed on (and before the caller acknowledges its task)."""
        now = time.time()
        key_list, args = change.script_args(self.settings, now)
        if change.target.terminal and self.durability.waits:
            raw = self._durable_transition(change.job_id, key_list, args)
        else:
            raw = self._transition(keys=key_list, args=args)
        result = _decode_result(change, raw)
        self._publish(result.held)
        if self.on_event is not None:
            for url, event in webhook_events(change, result, now):
                self.on_event(change.job_id, url, event)
        return result

    def _publish(self, notices: list[tuple[str, str]]) -> None:
        if notices:
            pipe = self.r.pipeline(transaction=False)
            for channel, message in notices:
                pipe.publish(channel, message)
            pipe.execute()

    def _durable_transition(self, job_id: str, key_list: list[str], args: list[str]) -> Any:
        # A worker waits as long as its lease would last: its job has ended and the end
        # must not be lost; past that the reaper would act on the job anyway.
        timeout_ms = max(self.durability.timeout_ms, int(self.settings.lease.ttl_s * 1000))
        raw, confirmed = self._durably(self._transition, key_list, args, timeout_ms)
        if not confirmed:
            log.error("%s", self.durability.not_confirmed(f"the end of job {job_id}").message)
        return raw

    def _durably(
        self, script: Any, key_list: list[str], args: list[str], timeout_ms: int | None = None
    ) -> tuple[Any, bool]:
        """`script`, then this connection's writes confirmed at `redis.durability` (as
        `AsyncJobStore._durably`): its reply, and whether they were confirmed in time."""
        if not self.durability.waits:
            return script(keys=key_list, args=args), True
        for attempt in range(2):
            pipe = self.r.pipeline(transaction=False)
            script(keys=key_list, args=args, client=pipe)
            self.durability.queue_wait(pipe, timeout_ms)
            raw, reply = pipe.execute(raise_on_error=False)
            if not (isinstance(raw, NoScriptError) and attempt == 0):  # the server restarted
                break
        if isinstance(raw, Exception):
            raise raw
        return raw, self.durability.confirmed(reply)

    def submit(self, job: Job, message: TaskMessage, max_queued: int) -> bool:
        """Store a new queued job with its task message (`submit_args`), confirmed at
        `redis.durability`; False when its queued set was full. A job that exists already
        (a release sent again after a crash) is left as it is, and counts as stored."""
        key_list, args = submit_args(job, self.settings, max_queued=max_queued, message=message)
        raw, confirmed = self._durably(self._submit, key_list, args)
        outcome = raw[0]
        if not confirmed and outcome == "ok":
            raise self.durability.not_confirmed(f"job {job.id}")
        return bool(outcome == "ok")

    def append_events(self, events: Sequence[NewEvent]) -> list[str]:
        """Append each event to its job's stream and publish them in one notice (one
        script call); returns their stream ids, '' for an event dropped because its job
        no longer has the lease it was made under (`NewEvent.lease_token`). Hands those
        written that a webhook wants to `on_event`."""
        if not events:
            return []
        key_list = [
            k
            for e in events
            for k in (keys.job_events(e.job_id), keys.job(e.job_id), keys.lease(e.job_id))
        ]
        batch = {
            "channel": keys.EVENTS_CHANNEL,
            "maxlen": self.settings.events_maxlen,
            "events": [
                {
                    "job_id": e.job_id,
                    "type": str(e.type),
                    "data": dumps(e.data),
                    "ts": repr(e.ts),
                    "first_output": repr(e.ts) if e.first_output else "",
                    "lease": e.lease_token,
                }
                for e in events
            ],
        }
        ids = [str(i) for i in self._append(keys=key_list, args=[dumps(batch)])]
        if self.on_event is not None:
            for event_id, e in zip(ids, events, strict=True):
                if event_id and e.webhook is not None and wants(e.webhook.events, e.type, e.data):
                    as_dict = _event(event_id, e.job_id, str(e.type), e.data, e.ts)
                    self.on_event(e.job_id, e.webhook.url, as_dict)
        return ids

    def append_event(
        self,
        job_id: str,
        etype: EventType,
        data: dict[str, Any],
        *,
        first_output: bool,
        webhook: WebhookSpec | None = None,
    ) -> str:
        """Append one event (see `append_events`); returns its stream id."""
        return self.append_events([NewEvent(job_id, etype, data, first_output, webhook)])[0]

    def renew_lease(self, job_id: str, lease: Lease) -> bool:
        return self.renew_leases([(job_id, lease)])[0]

    def renew_leases(self, held: Sequence[tuple[str, Lease]]) -> list[bool]:
        """Renew each (job id, lease) that is still its job's, in one round trip (a worker
        holds hundreds at once when it feeds an LLM engine); True where renewed."""
        pipe = self.r.pipeline(transaction=False)
        for job_id, lease in held:
            args = [lease.token, str(lease.ttl_ms), job_id]
            self._renew(keys=[keys.lease(job_id), keys.RUNNING], args=args, client=pipe)
        return [bool(renewed) for renewed in pipe.execute()] if held else []

    def server_time(self) -> float:
        """Redis's clock (seconds): what leases, deadlines and heartbeats are measured in,
        whatever this host's clock says."""
        return time_seconds(self.r.time())

    def give_back_lease(self, job_id: str, lease: Lease) -> bool:
        """Give up a held lease at once: the reaper requeues the job at its next sweep."""
        args = [lease.token, job_id]
        return bool(self._give_back(keys=[keys.lease(job_id), keys.RUNNING], args=args))

    def resend(self, job_id: str, message: TaskMessage) -> bool:
        """Push `message` if the job is still queued (its own went missing)."""
        key_list = [keys.job(job_id), message.list_key]
        return bool(self._resend(keys=key_list, args=[message.envelope]))

    def remember_answer(self, owner: str, policy: CachePolicy, output: dict[str, Any]) -> None:
        """Keep a deterministic request's answer in the response cache for `policy.ttl_s`
        (`JobInput.cache_policy`); the API answers the same request from it."""
        key = keys.response_cache(owner, policy.digest)
        self.r.set(key, dumps(output), px=max(1, int(policy.ttl_s * 1000)))

    def expired_running(self, limit: int = 100) -> list[str]:
        """Running jobs whose lease deadline (Redis's time) has passed."""
        now = self.server_time()
        return text_list(self.r.zrangebyscore(keys.RUNNING, "-inf", now, start=0, num=limit))

    def past_deadline(self, limit: int = 100) -> list[str]:
        """Ids of jobs whose deadline has passed (Redis's time), still to be enforced."""
        now = self.server_time()
        return text_list(self.r.zrangebyscore(keys.DEADLINES, "-inf", now, start=0, num=limit))

    def request_cancel(self, job_id: str) -> None:
        """Ask the worker running the job to stop it (as `AsyncJobStore.request_cancel`)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.job(job_id), "cancel_requested", "1")
        pipe.publish(keys.CANCEL_CHANNEL, job_id)
        pipe.execute()

    def cancel_requested(self, job_ids: list[str]) -> set[str]:
        if not job_ids:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "cancel_requested")
        return {j for j, flag in zip(job_ids, pipe.execute(), strict=True) if flag == "1"}

    def events(self, job_id: str, after: str | None = None) -> list[Event]:
        return _events_from(job_id, self.r.xrange(keys.job_events(job_id), _after(after)))


class AsyncJobStore:
    """Asynchronous store, for the API."""

    def __init__(
        self, client: aredis.Redis, settings: Settings, on_event: EventListener | None = None
    ) -> None:
        self.r = client
        self.settings = settings
        self.on_event = on_event
        self._submit = client.register_script(lua.SUBMIT)
        self._transition = client.register_script(lua.TRANSITION)
        self.durability = Durability(settings.redis)

    async def _durably(self, script: Any, key_list: list[str], args: list[str]) -> tuple[Any, bool]:
        """`script`, then this connection's writes confirmed at `redis.durability` (one
        round trip); its reply, and whether they were confirmed in time."""
        if not self.durability.waits:
            return await script(keys=key_list, args=args), True
        for attempt in range(2):
            async with self.r.pipeline(transaction=False) as pipe:
                await script(keys=key_list, args=args, client=pipe)
                self.durability.queue_wait(pipe)
                raw, reply = await pipe.execute(raise_on_error=False)
            # The server restarted between the pipeline's script check and its run (the
            # script did not run): once more, loading it again.
            if not (isinstance(raw, NoScriptError) and attempt == 0):
                break
        if isinstance(raw, Exception):
            raise raw
        return raw, self.durability.confirmed(reply)

    async def submit(
        self,
        job: Job,
        *,
        max_queued: int,
        idempotency: tuple[str, str] | None,
        message: TaskMessage | None = None,
    ) -> SubmitResult:
        """Store a new queued job unless its kind's queue is full or the key was used; in
        the same script, push its task `message` where given and count the submit (see
        `submit_counter`)."""
        key_list, args = submit_args(
            job,
            self.settings,
            max_queued=max_queued,
            idempotency=idempotency,
            message=message,
            counter=self.submit_counter(job),
        )
        raw, confirmed = await self._durably(self._submit, key_list, args)
        outcome, value = raw[0], raw[1]
        if not confirmed and outcome == "ok":
            raise self.durability.not_confirmed(f"job {job.id}")
        # value: the queued event's id ('' where a resent script found the job made).
        if outcome == "ok" and value and job.webhook is not None and self.on_event is not None:
            queued = _event(value, job.id, "status", {"status": "queued"}, job.created_at)
            if wants(job.webhook.events, "status", queued["data"]):
                await asyncio.to_thread(self.on_event, job.id, job.webhook.url, queued)
        if outcome == "dup":
            job_id, _, prev_hash = value.partition("|")
            return SubmitResult("dup", job_id, prev_hash)
        if outcome == "quota":
            return SubmitResult("quota", quota=value, limit=int(raw[2]), used=int(raw[3]))
        if outcome == "ok":
            return SubmitResult("ok", job.id, limit=int(raw[2]), used=int(raw[3]))
        return SubmitResult(outcome)

    def submit_counter(self, job: Job) -> tuple[str, str] | None:
        """(hash key, field) that an accepted submit adds one to; none here."""
        return None

    async def get(self, job_id: str) -> Job | None:
        fields = text_map(await self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    async def owner_of(self, job_id: str) -> str | None:
        """Whose job `job_id` is (None: no such job), without reading the whole job."""
        owner = await self.r.hget(keys.job(job_id), "owner")
        return None if owner is None else str(owner)

    async def _publish(self, notices: list[tuple[str, str]]) -> None:
        """The notices a script held back (`Transition.hold`), in one round trip."""
        if notices:
            pipe = self.r.pipeline(transaction=False)
            for channel, message in notices:
                pipe.publish(channel, message)
            await pipe.execute()

    async def apply(self, change: Transition) -> TransitionResult:
        now = time.time()
        key_list, args = change.script_args(self.settings, now)
        confirmed = True
        if change.target.terminal:
            raw, confirmed = await self._durably(self._transition, key_list, args)
        else:
            raw = await self._transition(keys=key_list, args=args)
        result = _decode_result(change, raw)
        await self._publish(result.held)  # the end is written: heard of, confirmed or not
        if not confirmed:
            raise self.durability.not_confirmed(f"the end of job {change.job_id}")
        if self.on_event is not None:
            for url, event in webhook_events(change, result, now):
                await asyncio.to_thread(self.on_event, change.job_id, url, event)
        return result

    async def cached_answer(self, owner: str, policy: CachePolicy) -> dict[str, Any] | None:
        """The response cache's answer to a request of this `policy`, if it has one."""
        raw = await self.r.get(keys.response_cache(owner, policy.digest))
        return None if raw is None else dict(json.loads(raw))

    async def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in await self.r.lrange(keys.deliveries(job_id), 0, -1)]

    async def quota_state(self, owner: str, window: int) -> tuple[dict[str, Any], int, int]:
        """The owner's own limits (`keys.LIMITS`; empty: the defaults), its jobs queued
        and its requests in quota window `window`."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hget(keys.LIMITS, owner)
        pipe.hget(keys.usage(owner), "queued")
        pipe.get(keys.requests_in(owner, window))
        own, queued, used = await pipe.execute()
        return (json.loads(own) if own else {}), int(queued or 0), int(used or 0)

    async def set_limits(self, owner: str, fields: str | None) -> None:
        """`owner`'s own limits as JSON (`jobs.quotas.own_fields`); None clears them."""
        if fields is None:
            await self.r.hdel(keys.LIMITS, owner)
        else:
            await self.r.hset(keys.LIMITS, owner, fields)

    async def request_cancel(self, job_id: str) -> None:
        await self.r.hset(keys.job(job_id), "cancel_requested", "1")
        await self.r.publish(keys.CANCEL_CHANNEL, job_id)

    async def list_ids(
        self, index: str, max_score: float | str, min_score: float | str, count: int
    ) -> list[tuple[str, float]]:
        """(job id, created_at) of an index (`keys.owner_jobs`, `keys.ALL_JOBS`), newest
        first, from `max_score` down to `min_score`."""
        rows = await self.r.zrevrangebyscore(
            index, max_score, min_score, start=0, num=count, withscores=True
        )
        return [(str(row[0]), float(row[1])) for row in rows]

    async def get_many(self, job_ids: list[str]) -> list[Job | None]:
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(keys.job(job_id))
        return [job_from_fields(f) if f else None for f in await pipe.execute()]

    async def forget(self, index: str, job_ids: list[str]) -> None:
        """Drop ids (of expired jobs) from an index."""
        if job_ids:
            await self.r.zrem(index, *job_ids)

    async def events(self, job_id: str, after: str | None = None) -> list[Event]:
        return _events_from(job_id, await self.r.xrange(keys.job_events(job_id), _after(after)))
