"""The Redis job store: a hash per job, an owner index, leases, events.

`JobStore` (sync: workers, reaper, CLI) and `AsyncJobStore` (the API) share the Lua
scripts and the changes of `jobstore.changes`, so a transition is written in one place.

A metered store (`metered=True`) also counts every accepted submit (in the script that
stores the job) and every transition that ends a job, wherever it happens: a worker, the
reaper, a cancel or a cached answer in the API. A transition to a terminal status succeeds
once per job (the script checks the current status), so each end is counted once; the
script that ends the job returns the fields its metrics need (`Transition.read_back`).
In workers and the reaper the samples go to the process's `MetricsTally` (written once per
`metrics_flush_s`: no round trip per job); in the API they go to Redis in one pipelined
round trip. The same writes add to the overview's per-minute counts (`telemetry/recent.py`). A
submit refused with 429 is counted in the API (one round trip, on that path alone).
Metrics never fail a job: a Redis error while counting is logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Self

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from broker.kombu_redis import TaskMessage
from common import redis_client
from jobs import keys
from jobs.models import Event, EventType, Job, WebhookSpec
from jobs.schemas.base import CachePolicy
from jobs.settings import Settings
from jobs.webhooks import wants
from jobstore import lua, quotas
from jobstore.changes import (
    ALL_FIELDS,
    Lease,
    SubmitResult,
    Transition,
    TransitionResult,
    decode_result,
    event_dict,
    submit_args,
    webhook_events,
)
from jobstore.codec import (
    dumps,
    event_from_entry,
    job_from_fields,
    text_list,
    text_map,
    time_seconds,
)
from jobstore.durability import Durability
from telemetry import recent
from telemetry.metrics import (
    END_FIELDS,
    JOBS_REJECTED,
    JOBS_SUBMITTED,
    Sample,
    end_samples,
    field_of,
    queue,
)
from telemetry.tally import MetricsTally

EventListener = Callable[[str, str, dict[str, Any]], None]
"""(job_id, webhook url, event) -> None: hands an event to webhook delivery."""

log = logging.getLogger("mmq.store")


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


def _events_from(job_id: str, entries: Any) -> list[Event]:
    """Events from an XRANGE reply (of a decoding client)."""
    return [event_from_entry(job_id, entry_id, fields) for entry_id, fields in entries or []]


def _after(after: str | None) -> str:
    return f"({after}" if after else "-"


def _settle(replies: list[Any], attempt: int, durability: Durability) -> tuple[Any, bool] | None:
    """A script's reply and the durability wait's, run in one pipeline: (the script's
    reply, whether its writes were confirmed in time); None on the first attempt when the
    server restarted between the pipeline's script check and its run (the script did not
    run): send it once more, loading it again. A script's error is raised."""
    raw, wait = replies
    if isinstance(raw, NoScriptError) and attempt == 0:
        return None
    if isinstance(raw, Exception):
        raise raw
    return raw, durability.confirmed(wait)


def _reading_end_fields(change: Transition) -> Transition:
    """`change`, returning the fields its end metrics need when it ends the job (all of
    them, where the caller asked for all)."""
    if not change.target.terminal or change.read_back == ALL_FIELDS:
        return change
    return replace(change, read_back=END_FIELDS)


def _end_counts(
    change: Transition, result: TransitionResult
) -> tuple[list[Sample], list[recent.Cell]]:
    """The metric samples of a change that ended its job, and the overview's cells."""
    if not (result.ok and change.target.terminal):
        return [], []
    samples = end_samples({name: value or None for name, value in result.read_back.items()})
    return samples, recent.end_cells(result.read_back, samples) if samples else []


class JobStore:
    """Synchronous store, for worker processes, the reaper and the CLI. Metered, it adds
    the ends it records to `tally`, which its owner starts and stops (and may add to)."""

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        on_event: EventListener | None = None,
        *,
        metered: bool = False,
    ) -> None:
        self.r = client
        self.settings = settings
        self.on_event = on_event
        self.metered = metered
        self.tally = MetricsTally(client, settings.metrics_flush_s)
        self._transition = client.register_script(lua.TRANSITION)
        self._submit = client.register_script(lua.SUBMIT)
        self.durability = Durability(settings.redis)
        self._append = client.register_script(lua.APPEND_EVENTS)
        self._renew = client.register_script(lua.RENEW_LEASE)
        self._give_back = client.register_script(lua.GIVE_BACK_LEASE)
        self._resend = client.register_script(lua.RESEND)
        self._preempt = client.register_script(lua.REQUEST_PREEMPT)

    @classmethod
    def connect(
        cls, settings: Settings, on_event: EventListener | None = None, *, metered: bool = False
    ) -> Self:
        if not settings.redis_url:
            raise ValueError("redis_url is not set")
        # A command on a connection whose peer went silent (a partition) gives up after
        # this, so that a worker notices it cannot renew its leases; longer than any wait
        # it makes on purpose (the confirmation of an end, up to a lease).
        ttl_s = settings.lease.ttl_s
        wait_s = max(settings.redis.durability_timeout_ms / 1000, ttl_s)
        client = redis_client.connect(settings.redis_url, socket_timeout=wait_s + ttl_s)
        return cls(client, settings, on_event, metered=metered)

    def get(self, job_id: str) -> Job | None:
        fields = text_map(self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    def apply(self, change: Transition) -> TransitionResult:
        """Run the change; one that ends the job is confirmed at `redis.durability` before
        its webhooks are handed on (and before the caller acknowledges its task)."""
        now = time.time()
        if self.metered:
            change = _reading_end_fields(change)
        key_list, args = change.script_args(self.settings, now)
        if change.target.terminal and self.durability.waits:
            raw = self._durable_transition(change.job_id, key_list, args)
        else:
            raw = self._transition(keys=key_list, args=args)
        result = decode_result(change, raw)
        self._publish(result.held)
        if self.metered:
            samples, cells = _end_counts(change, result)
            self.tally.add(samples)
            self.tally.count(cells, recent.KEEP_S)
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
        `AsyncJobStore._durably`, by `_settle`): its reply, and whether they were confirmed."""
        if not self.durability.waits:
            return script(keys=key_list, args=args), True
        for attempt in range(2):
            pipe = self.r.pipeline(transaction=False)
            script(keys=key_list, args=args, client=pipe)
            self.durability.queue_wait(pipe, timeout_ms)
            settled = _settle(pipe.execute(raise_on_error=False), attempt, self.durability)
            if settled is not None:
                return settled
        raise AssertionError("_settle answers on the second attempt")

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
                    as_dict = event_dict(event_id, e.job_id, str(e.type), e.data, e.ts)
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

    def request_preempt(self, job_id: str) -> bool:
        """Ask the worker running a batch line to stop it at its next step and queue it
        again (`batches.preempt`); False if it is no longer running."""
        return bool(self._preempt(keys=[keys.job(job_id)], args=[keys.CANCEL_CHANNEL, job_id]))

    def stop_requested(self, job_ids: list[str]) -> set[str]:
        """Those of `job_ids` asked to stop: canceled, or preempted for interactive work."""
        if not job_ids:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), "cancel_requested", "preempt_requested")
        return {j for j, flags in zip(job_ids, pipe.execute(), strict=True) if "1" in flags}

    def preempted(self, job_id: str) -> bool:
        """Whether a run that stopped on a stop request was preempted (and not canceled)."""
        cancel, preempt = self.r.hmget(keys.job(job_id), "cancel_requested", "preempt_requested")
        return preempt == "1" and cancel != "1"

    def events(self, job_id: str, after: str | None = None) -> list[Event]:
        return _events_from(job_id, self.r.xrange(keys.job_events(job_id), _after(after)))


class AsyncJobStore:
    """Asynchronous store, for the API."""

    def __init__(
        self,
        client: aredis.Redis,
        settings: Settings,
        on_event: EventListener | None = None,
        *,
        metered: bool = False,
    ) -> None:
        self.r = client
        self.settings = settings
        self.on_event = on_event
        self.metered = metered
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
                replies = await pipe.execute(raise_on_error=False)
            settled = _settle(replies, attempt, self.durability)
            if settled is not None:
                return settled
        raise AssertionError("_settle answers on the second attempt")

    async def submit(
        self,
        job: Job,
        *,
        max_queued: int,
        idempotency: tuple[str, str] | None,
        message: TaskMessage | None = None,
        cost: int = 0,
    ) -> SubmitResult:
        """Store a new queued job unless its kind's queue is full, the key was used or its
        owner is over a quota; in the same script, push its task `message` where given
        and count the submit (metered) and its `cost`; a metered store also counts a
        submit refused because the queue was full."""
        key_list, args = submit_args(
            job,
            self.settings,
            max_queued=max_queued,
            idempotency=idempotency,
            message=message,
            counter=(keys.metric(JOBS_SUBMITTED.name), field_of((job.kind,)))
            if self.metered
            else None,
            cost=cost,
        )
        raw, confirmed = await self._durably(self._submit, key_list, args)
        outcome, value = raw[0], raw[1]
        if not confirmed and outcome == "ok":
            raise self.durability.not_confirmed(f"job {job.id}")
        # value: the queued event's id ('' where a resent script found the job made).
        if outcome == "ok" and value and job.webhook is not None and self.on_event is not None:
            queued = event_dict(value, job.id, "status", {"status": "queued"}, job.created_at)
            if wants(job.webhook.events, "status", queued["data"]):
                await asyncio.to_thread(self.on_event, job.id, job.webhook.url, queued)
        if outcome == "full" and self.metered:
            labels = (job.kind, job.pipeline)
            rejected = [recent.rejected_cell(*labels, now=job.created_at)]
            await self._count([(JOBS_REJECTED, labels, 1)], rejected, job.id)
        if outcome == "dup":
            job_id, _, prev_hash = value.partition("|")
            return SubmitResult("dup", job_id, prev_hash)
        if outcome == "quota":
            return SubmitResult("quota", quota=value, limit=int(raw[2]), used=int(raw[3]))
        if outcome == "ok":
            return SubmitResult(
                "ok", job.id, limit=int(raw[2]), used=int(raw[3]),
                cost_limit=int(raw[4]), cost_used=int(raw[5]),
            )  # fmt: skip
        return SubmitResult(outcome)

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
        if self.metered:
            change = _reading_end_fields(change)
        key_list, args = change.script_args(self.settings, now)
        confirmed = True
        if change.target.terminal:
            raw, confirmed = await self._durably(self._transition, key_list, args)
        else:
            raw = await self._transition(keys=key_list, args=args)
        result = decode_result(change, raw)
        await self._publish(result.held)  # the end is written: heard of, confirmed or not
        if not confirmed:
            raise self.durability.not_confirmed(f"the end of job {change.job_id}")
        if self.metered:
            samples, cells = _end_counts(change, result)
            if samples:
                await self._count(samples, cells, change.job_id)
        if self.on_event is not None:
            for url, event in webhook_events(change, result, now):
                await asyncio.to_thread(self.on_event, change.job_id, url, event)
        return result

    async def _count(self, samples: list[Sample], cells: list[recent.Cell], job_id: str) -> None:
        """The counters and the overview's per-minute counts, in one round trip."""
        try:
            pipe = self.r.pipeline(transaction=False)
            queue(pipe, samples)
            for key, name, amount in cells:
                pipe.hincrby(key, name, amount)
            for key in {key for key, _, _ in cells}:
                pipe.expire(key, recent.KEEP_S)
            await pipe.execute()
        except redis.RedisError as exc:
            log.warning("job %s: not counted in metrics: %s", job_id, exc)

    async def cached_answer(self, owner: str, policy: CachePolicy) -> dict[str, Any] | None:
        """The response cache's answer to a request of this `policy`, if it has one."""
        raw = await self.r.get(keys.response_cache(owner, policy.digest))
        return None if raw is None else dict(json.loads(raw))

    async def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in await self.r.lrange(keys.deliveries(job_id), 0, -1)]

    async def quota_state(self, owner: str, window: int) -> list[Any]:
        """What `jobstore.quotas.from_reads` takes: the owner's own limits, its usage now and
        in quota window `window`."""
        pipe = self.r.pipeline(transaction=False)
        quotas.reads(pipe, owner, window)
        return list(await pipe.execute())

    async def set_limits(self, owner: str, fields: str | None) -> None:
        """`owner`'s own limits as JSON (`jobstore.quotas.own_fields`); None clears them."""
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
