"""The changes the store writes, built without I/O: a job's status change (`Transition`,
and the named ones of `jobstore.operations`), a submit's script arguments (`submit_args`),
and the decoding of what the scripts answer (`decode_submit`, `decode_result`). Either
store (`jobstore.store`) runs them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypedDict

from broker.kombu_redis import PRIORITY_VALUES, TaskMessage
from jobs import keys
from jobs.models import EventType, Job, WebhookSpec
from jobs.outputs import JobOutput
from jobs.settings import Settings
from jobs.states import JobStatus, allowed_sources, check_transition
from jobs.webhooks import wants
from jobs.wire import JobError, JobEvent
from jobstore.codec import dumps, flat_pairs, job_to_fields

LeaseMode = Literal["", "check", "absent", "acquire"]

ALL_FIELDS = ("*",)
"""`Transition.read_back` for every field of the job."""


class StatusData(TypedDict, total=False):
    """What a status event says beside its `status` (`Transition.event_data`)."""

    worker: str
    """`running`: the worker that took the job."""
    reason: str
    """`queued` again: `worker_lost`, `preempted` or `shutdown`; `expired` (and `canceled` at a
    deadline): `deadline`."""
    attempts: int
    """`queued` again after a lost worker: the runs it has had."""
    error: JobError
    """`failed`: why."""


class PreEvent(NamedTuple):
    """An output or error event that a transition writes just before its status event."""

    type: EventType
    data: JobOutput | JobError


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


@dataclass
class SubmitResult:
    outcome: Literal["ok", "dup", "full", "quota"]
    job_id: str = ""
    body_hash: str = ""
    quota: str = ""
    """For `quota`: the one exceeded (`requests`, `queued`, `cost`)."""
    limit: int = 0
    """For `ok`: the owner's requests limit (0: none); for `quota`: the exceeded one's."""
    used: int = 0
    """For `ok`: the owner's requests in this window, this one included; for `quota`:
    what it has of the exceeded one."""
    cost_limit: int = 0
    """For `ok`: the owner's cost limit for the job's kind (0: none)."""
    cost_used: int = 0
    """For `ok`: the owner's cost of the job's kind in this window, this one included."""


@dataclass
class Transition:
    """Everything a status change writes: built once, run by either store."""

    job_id: str
    target: JobStatus
    sources: frozenset[JobStatus]
    fields: dict[str, str] = field(default_factory=dict)
    event_data: StatusData = field(default_factory=StatusData)
    lease_mode: LeaseMode = ""
    lease: Lease | None = None
    kind: str = ""
    pre_event: PreEvent | None = None
    """An output or error event written atomically just before the status event."""
    webhook: WebhookSpec | None = None
    read_back: tuple[str, ...] = ()
    """Fields the script returns after a successful change (no second read); `ALL_FIELDS`
    for the whole job."""
    message: TaskMessage | None = None
    """A requeue's task message, pushed by the same script (a queued job always has one)."""
    charge: tuple[str, int, int] | None = None
    """(`keys.cost_in` key, amount, TTL s): a cost known only at the end
    (`JobInput.cost_after`), counted by the same script."""

    def webhook_after(self, result: TransitionResult) -> WebhookSpec | None:
        """The job's webhook: as given, else as read back with `ALL_FIELDS`."""
        if self.webhook is not None or self.read_back != ALL_FIELDS:
            return self.webhook
        raw = result.read_back.get("webhook")
        return WebhookSpec.model_validate_json(raw) if raw else None

    def written_events(self, result: TransitionResult, now: float) -> list[JobEvent]:
        """The events a successful transition wrote."""
        events = []
        if self.pre_event is not None:
            etype, data = self.pre_event
            events.append(
                JobEvent(
                    id=result.pre_event_id,
                    job_id=self.job_id,
                    type=str(etype),
                    data={**data},
                    ts=now,
                )
            )
        status = JobEvent(
            id=result.event_id,
            job_id=self.job_id,
            type="status",
            data={"status": str(self.target), **self.event_data},
            ts=now,
        )
        return [*events, status]

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
        if self.charge is not None:
            key, amount, ttl_s = self.charge
            change["charge"] = {"key": key, "amount": amount, "ttl_s": ttl_s}
        return key_list, [dumps(change)]


def transition(
    job: Job,
    target: JobStatus,
    *,
    fields: dict[str, str] | None = None,
    event_data: StatusData | None = None,
    lease_mode: LeaseMode = "",
    lease: Lease | None = None,
    sources: frozenset[JobStatus] | None = None,
    pre_event: PreEvent | None = None,
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


def webhook_events(
    change: Transition, result: TransitionResult, now: float
) -> list[tuple[str, JobEvent]]:
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
    cost: int = 0,
) -> tuple[list[str], list[str]]:
    """The submit script's keys and its one argument: store `job` queued unless its
    queued set holds `max_queued` (a batch line's is `keys.queued_batch`, which the 429
    bound never counts), the Idempotency-Key was used or its key is over a quota (`cost`:
    the job's, `JobInput.cost`), push its task `message` and count the submit in
    `counter` (hash key, field)."""
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
        keys.cost_in(job.owner, job.kind, window),
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
        hold = {
            "entry": dumps(entry),
            "field": f"{job.pipeline}|{job.priority}",
            "priority": job.priority,
            "takes": [p for p in ("high", "normal", "low") if PRIORITY_VALUES[p] >= mine],
        }
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
            "max_running": quotas.max_running,
            "cost_limit": quotas.costs.get(job.kind, 0),
            "kind": job.kind,
            "cost": cost,
            "window_ttl_s": 2 * quotas.window_s,
        },
    }
    if hold is not None:
        submit["hold"] = hold
    return key_list, [dumps(submit)]


def decode_submit(job_id: str, raw: list[Any]) -> SubmitResult:
    """The submit script's answer (`lua.SUBMIT`) for job `job_id`."""
    outcome, value = raw[0], raw[1]
    if outcome == "dup":
        dup_id, _, prev_hash = str(value).partition("|")
        return SubmitResult("dup", dup_id, prev_hash)
    if outcome == "quota":
        return SubmitResult("quota", quota=value, limit=int(raw[2]), used=int(raw[3]))
    if outcome == "ok":
        return SubmitResult(
            "ok", job_id, limit=int(raw[2]), used=int(raw[3]),
            cost_limit=int(raw[4]), cost_used=int(raw[5]),
        )  # fmt: skip
    return SubmitResult(outcome)


def decode_result(change: Transition, raw: list[Any]) -> TransitionResult:
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
