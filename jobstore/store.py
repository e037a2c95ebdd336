"""The Redis job store: a hash per job, an owner index, leases, events.

`JobStore` (sync: workers, reaper, CLI) and `AsyncJobStore` (the API) share the Lua
scripts and the changes of `jobstore.changes`, so a transition is written in one place,
and every step of their operations that is not I/O (`StoreBase`): the operations both
have (`submit`, `apply`, `get`, `events`, `request_cancel`) take the same arguments, give
the same answers and raise the same errors, one of them awaited. They differ where the
process does: a sync store hands webhook events to `on_event` in the calling thread and
adds its metrics to its tally; the async one hands them on in a thread and writes its
metrics in one round trip.

A write Redis has made but does not confirm at `redis.durability` in time (a submit that
stored its job, a change that ended one) raises `NotDurable`, in either store, once the
store has done what the write implies (its held notices published, its metrics counted,
its webhook events handed on: the job exists, or has ended, on the primary, and nothing
would do them later). The API answers 503 (never "accepted"); a worker and the reaper log
it and go on (their end is written; should a failover lose it, the job is running there
under a lease that expires, and the reaper takes it back). A write the script refused (a
full queue, a lease not held) made nothing: its answer comes back, with nothing to
confirm. A change that ends a job waits `end_wait_ms` for its confirmation: a store made
by `JobStore.connect` (workers, the reaper) as long as a lease lasts, any other
`redis.durability_timeout_ms`, as a submit does.

A metered store (`metered=True`) also counts every accepted submit (in the script that
stores the job) and every transition that ends a job, wherever it happens: a worker, the
reaper, a cancel or a cached answer in the API. A transition to a terminal status succeeds
once per job (the script checks the current status), so each end is counted once; the
script that ends the job returns the fields its metrics need (`Transition.read_back`).
In workers and the reaper the samples go to the process's `MetricsTally` (written once per
`metrics_flush_s`: no round trip per job); in the API they go to Redis in one pipelined
round trip. The same writes add to the overview's per-minute counts
(`jobstore/recent_counts.py`). A submit refused with 429 is counted in the API (one round
trip, on that path alone).
Metrics never fail a job: a Redis error while counting is logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import orjson
import redis
import redis.asyncio as aredis
from redis.commands.core import AsyncScript, Script

from broker.kombu_redis import TaskMessage
from common import redis_client
from jobs import keys
from jobs.models import Event, EventType, Job, WebhookSpec
from jobs.outputs import JobOutput
from jobs.schemas.base import CachePolicy
from jobs.settings import Settings
from jobs.webhooks import wants
from jobs.wire import JobEvent
from jobstore import lua, quotas
from jobstore import recent_counts as recent
from jobstore.changes import (
    Lease,
    SubmitResult,
    Transition,
    TransitionResult,
)
from jobstore.codec import (
    dumps,
    job_from_fields,
    text_list,
    text_map,
    time_seconds,
)
from jobstore.metric_counts import MetricsTally, queue_samples
from jobstore.store_base import (
    NOT_WAITED,
    Answer,
    Done,
    EventListener,
    StoreBase,
    after_bound,
    end_wait_for_runs,
    events_from,
    settle,
)
from telemetry.metric_defs import Sample

log = logging.getLogger("mmq.store")


@dataclass(frozen=True)
class NewEvent:
    """An event of a running job, to append to its stream (`JobStore.append_events`)."""

    job_id: str
    type: EventType
    data: dict[str, Any] | bytes
    """Any JSON object: a pipeline's partial or progress (`jobs.outputs.EventData`), or a
    status; stored as it is. Bytes are that object's JSON already (an LLM job's tokens,
    encoded once where they were taken: `workers.event_writer.EventWriter.stream`)."""
    first_output: bool = False
    """Whether it is an output (partial or progress): the job's first one sets its
    `first_output_at`."""
    webhook: WebhookSpec | None = None
    ts: float = field(default_factory=time.time)
    lease_token: str = ""
    """The lease of the run that made it ('' for none): the event is written only while
    its job still has that lease (an abandoned run's late events are dropped)."""
    text_at: int = 0
    """Where `data` (bytes) holds an LLM token's text, last, the offset its JSON string
    starts at: the API relays that text without decoding the event (`Event.text_at`)."""


class JobStore(StoreBase):
    """Synchronous store, for worker processes, the reaper and the CLI. Metered, it adds
    the ends it records to `tally`, which its owner starts and stops (and may add to)."""

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        on_event: EventListener | None = None,
        *,
        metered: bool = False,
        end_wait_ms: int | None = None,
    ) -> None:
        super().__init__(settings, on_event, metered, end_wait_ms)
        self.r = client
        self.tally = MetricsTally(client, settings.metrics_flush_s)
        self._transition = client.register_script(lua.TRANSITION)
        self._transitions = client.register_script(lua.TRANSITIONS)
        self._submit = client.register_script(lua.SUBMIT)
        self._append = client.register_script(lua.APPEND_EVENTS)
        self._renew = client.register_script(lua.RENEW_LEASE)
        self._give_back = client.register_script(lua.GIVE_BACK_LEASE)
        self._resend = client.register_script(lua.RESEND)
        self._preempt = client.register_script(lua.REQUEST_PREEMPT)

    @classmethod
    def connect(
        cls, settings: Settings, on_event: EventListener | None = None, *, metered: bool = False
    ) -> Self:
        """The store of a worker, the reaper or the CLI: an end waits for its confirmation
        as long as a lease would last (`end_wait_for_runs`)."""
        if not settings.redis_url:
            raise ValueError("redis_url is not set")
        # A command on a connection whose peer went silent (a partition) gives up after
        # this, so that a worker notices it cannot renew its leases; longer than any wait
        # it makes on purpose (the confirmation of an end, up to a lease).
        ttl_s = settings.lease.ttl_s
        end_wait_ms = end_wait_for_runs(settings)
        client = redis_client.connect(settings.redis_url, socket_timeout=end_wait_ms / 1000 + ttl_s)
        return cls(client, settings, on_event, metered=metered, end_wait_ms=end_wait_ms)

    def submit(
        self,
        job: Job,
        message: TaskMessage | None,
        max_queued: int,
        *,
        idempotency: tuple[str, str] | None = None,
        cost: int = 0,
    ) -> SubmitResult:
        """Store a new queued job unless its queued set holds `max_queued` (`full`), the
        Idempotency-Key was used (`dup`) or its owner is over a quota (`quota`); in the
        same script, push its task `message` where given (None: a job answered without a
        worker) and count the submit (metered) and its `cost`. A job that exists already (a
        release sent again after a crash) is left as it is, and counts as stored (`ok`).
        Stored but not confirmed at `redis.durability`: `NotDurable` (its queued webhook
        handed on first). A metered store also counts a submit refused as `full`."""
        key_list, args, wait_ms = self._submit_call(job, message, max_queued, idempotency, cost)
        raw, wait = self._run(self._submit, key_list, args, wait_ms)
        done = self._submitted(job, raw, wait)
        self._follow_up(job.id, done)
        return done.result()

    def apply(self, change: Transition) -> TransitionResult:
        """Run the change; one that ends the job is confirmed at `redis.durability` (up to
        `end_wait_ms`) before its held notices are published and its webhook events handed
        to `on_event`. A change refused (status, lease...) wrote nothing: its result says
        why. One made but not confirmed: its notices, metrics and webhook events all the
        same (the script ends a job once: nothing would do them later), then `NotDurable`."""
        now = time.time()
        change, key_list, args, wait_ms = self._change_call(change, now)
        raw, wait = self._run(self._transition, key_list, args, wait_ms)
        done = self._applied(change, raw, wait, now)
        self._follow_up(change.job_id, done)
        return done.result()

    def apply_many(self, changes: Sequence[Transition]) -> list[Done[TransitionResult]]:
        """The changes in one script call (`lua.TRANSITIONS`), and one wait for their
        confirmation where one of them ends its job: each made as `apply` makes it, with
        what it implies done (the notices held back published in one round trip). The
        answers come as `Done`s, in order: `result()` returns or raises what `apply` would
        (a change that raised in the script raises its `ResponseError` there alone)."""
        if not changes:
            return []
        now = time.time()
        calls = [self._change_call(change, now) for change in changes]
        key_list = [k for _, change_keys, _, _ in calls for k in change_keys]
        args = [arg for _, _, change_args, _ in calls for arg in change_args]
        waits = [wait_ms for *_, wait_ms in calls if wait_ms is not None]
        raws, wait = self._run(self._transitions, key_list, args, max(waits, default=None))
        dones = []
        for (change, _, _, wait_ms), raw in zip(calls, raws, strict=True):
            if raw[0] == "error":
                refused = TransitionResult(ok=False, reason="error", status=raw[1])
                failed = redis.ResponseError(f"job {change.job_id}: {raw[1]}")
                dones.append(Done(refused, failed=failed))
                continue
            dones.append(self._applied(change, raw, NOT_WAITED if wait_ms is None else wait, now))
        self._publish([notice for done in dones for notice in done.held])
        for (change, *_), done in zip(calls, dones, strict=True):
            self._hand_on(change.job_id, done)
        return dones

    def get(self, job_id: str) -> Job | None:
        fields = text_map(self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    def events(self, job_id: str, after: str | None = None) -> list[Event]:
        """The job's events after stream id `after` (all: None)."""
        return events_from(job_id, self.r.xrange(keys.job_events(job_id), after_bound(after)))

    def request_cancel(self, job_id: str) -> None:
        """Ask the worker running the job to stop it: the flag, and a notice to every
        worker (one round trip)."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.job(job_id), "cancel_requested", "1")
        pipe.publish(keys.CANCEL_CHANNEL, job_id)
        pipe.execute()

    def _run(
        self, script: Script, key_list: list[str], args: list[str], wait_ms: int | None
    ) -> tuple[Any, Any]:
        """`script`'s reply, and that of the wait for this connection's writes at
        `redis.durability` (up to `wait_ms`; `NOT_WAITED` where None), in one round trip."""
        if wait_ms is None:
            return script(keys=key_list, args=args), NOT_WAITED
        for attempt in range(2):
            with self.r.pipeline(transaction=False) as pipe:
                script(keys=key_list, args=args, client=pipe)
                self.durability.queue_wait(pipe, wait_ms)
                replies = pipe.execute(raise_on_error=False)
            settled = settle(replies, attempt)
            if settled is not None:
                return settled
        raise AssertionError("settle answers on the second attempt")

    def _follow_up(self, job_id: str, done: Done[Answer]) -> None:
        """What a write implies, confirmed or not: the notices it held back published, its
        metrics counted, its webhook events handed on."""
        self._publish(done.held)
        self._hand_on(job_id, done)

    def _hand_on(self, job_id: str, done: Done[Answer]) -> None:
        """`_follow_up` but the notices: the metrics counted, the webhook events handed on."""
        self._count(done.samples, done.cells, job_id)
        if self.on_event is not None:
            for url, event in done.webhooks:
                self.on_event(job_id, url, event)

    def _publish(self, notices: list[tuple[str, str]]) -> None:
        """The notices a script held back (`Transition.hold`), in one round trip."""
        if notices:
            pipe = self.r.pipeline(transaction=False)
            for channel, message in notices:
                pipe.publish(channel, message)
            pipe.execute()

    def _count(self, samples: list[Sample], cells: list[recent.Cell], job_id: str) -> None:
        """To the tally (written once per `metrics_flush_s`: no round trip per job)."""
        if samples or cells:
            self.tally.add(samples)
            self.tally.count(cells, recent.KEEP_S)

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
        args: list[str | bytes] = [keys.EVENTS_CHANNEL, str(self.settings.events_maxlen)]
        for e in events:
            first_output = repr(e.ts) if e.first_output else ""
            encoded = e.data if isinstance(e.data, bytes) else dumps(e.data)
            args += (e.job_id, e.type.value, encoded, repr(e.ts), first_output, e.lease_token)
            args.append(str(e.text_at))
        ids = [str(i) for i in self._append(keys=key_list, args=args)]
        if self.on_event is not None:
            for event_id, e in zip(ids, events, strict=True):
                if not event_id or e.webhook is None:
                    continue
                sent = orjson.loads(e.data) if isinstance(e.data, bytes) else e.data
                if wants(e.webhook.events, e.type, sent):
                    event = JobEvent(
                        id=event_id, job_id=e.job_id, type=str(e.type), data=sent, ts=e.ts
                    )
                    self.on_event(e.job_id, e.webhook.url, event)
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
        """Append one event (see `append_events`, and `NewEvent.data`); returns its stream
        id."""
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

    def remember_answer(self, owner: str, policy: CachePolicy, output: JobOutput) -> None:
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

    def forget_running(self, job_id: str) -> None:
        """Drop a job from the running index (it ended, or its record is gone)."""
        self.r.zrem(keys.RUNNING, job_id)

    def forget_deadline(self, job_id: str) -> None:
        """Drop a job from the deadlines index (its deadline is enforced, or moot)."""
        self.r.zrem(keys.DEADLINES, job_id)

    def queued_since(self, before: float, scan_count: int = 500) -> list[str]:
        """Queued job ids (every kind) whose last queueing was before `before`, but those
        held by fair share (their message waits in a hold list for the scheduler)."""
        ids = [
            job_id
            for key in text_list(self.r.scan_iter(match=keys.queued("*"), count=scan_count))
            for job_id in text_list(self.r.smembers(key))
        ]
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.job(job_id), ["queued_at", "held"])
        found = pipe.execute()
        return [
            j
            for j, (at, held) in zip(ids, found, strict=True)
            if at and float(at) < before and not held
        ]

    def priority_of(self, job_id: str) -> str:
        """The job's priority (`normal` for a record that is gone)."""
        return str(self.r.hget(keys.job(job_id), "priority") or "normal")

    def push_front(self, message: TaskMessage) -> None:
        """A job's task message again, at the front of its queue list (taken next)."""
        self.r.rpush(message.list_key, message.envelope)

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


class AsyncJobStore(StoreBase):
    """Asynchronous store, for the API: `JobStore`'s answers and errors, awaited. It
    hands webhook events to `on_event` in a thread, and writes its metrics in one round
    trip (`_count`)."""

    def __init__(
        self,
        client: aredis.Redis,
        settings: Settings,
        on_event: EventListener | None = None,
        *,
        metered: bool = False,
        end_wait_ms: int | None = None,
    ) -> None:
        super().__init__(settings, on_event, metered, end_wait_ms)
        self.r = client
        self._submit = client.register_script(lua.SUBMIT)
        self._transition = client.register_script(lua.TRANSITION)

    async def submit(
        self,
        job: Job,
        message: TaskMessage | None,
        max_queued: int,
        *,
        idempotency: tuple[str, str] | None = None,
        cost: int = 0,
    ) -> SubmitResult:
        """As `JobStore.submit`."""
        key_list, args, wait_ms = self._submit_call(job, message, max_queued, idempotency, cost)
        raw, wait = await self._run(self._submit, key_list, args, wait_ms)
        done = self._submitted(job, raw, wait)
        await self._follow_up(job.id, done)
        return done.result()

    async def apply(self, change: Transition) -> TransitionResult:
        """As `JobStore.apply`."""
        now = time.time()
        change, key_list, args, wait_ms = self._change_call(change, now)
        raw, wait = await self._run(self._transition, key_list, args, wait_ms)
        done = self._applied(change, raw, wait, now)
        await self._follow_up(change.job_id, done)
        return done.result()

    async def get(self, job_id: str) -> Job | None:
        fields = text_map(await self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    async def events(self, job_id: str, after: str | None = None) -> list[Event]:
        """As `JobStore.events`."""
        return events_from(job_id, await self.r.xrange(keys.job_events(job_id), after_bound(after)))

    async def request_cancel(self, job_id: str) -> None:
        """As `JobStore.request_cancel`."""
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.job(job_id), "cancel_requested", "1")
        pipe.publish(keys.CANCEL_CHANNEL, job_id)
        await pipe.execute()

    async def _run(
        self, script: AsyncScript, key_list: list[str], args: list[str], wait_ms: int | None
    ) -> tuple[Any, Any]:
        """As `JobStore._run`."""
        if wait_ms is None:
            return await script(keys=key_list, args=args), NOT_WAITED
        for attempt in range(2):
            async with self.r.pipeline(transaction=False) as pipe:
                await script(keys=key_list, args=args, client=pipe)
                self.durability.queue_wait(pipe, wait_ms)
                replies = await pipe.execute(raise_on_error=False)
            settled = settle(replies, attempt)
            if settled is not None:
                return settled
        raise AssertionError("settle answers on the second attempt")

    async def _follow_up(self, job_id: str, done: Done[Answer]) -> None:
        """As `JobStore._follow_up`; `on_event` runs in a thread (it may block)."""
        await self._publish(done.held)
        await self._count(done.samples, done.cells, job_id)
        if self.on_event is not None:
            for url, event in done.webhooks:
                await asyncio.to_thread(self.on_event, job_id, url, event)

    async def _publish(self, notices: list[tuple[str, str]]) -> None:
        """As `JobStore._publish`."""
        if notices:
            pipe = self.r.pipeline(transaction=False)
            for channel, message in notices:
                pipe.publish(channel, message)
            await pipe.execute()

    async def _count(self, samples: list[Sample], cells: list[recent.Cell], job_id: str) -> None:
        """The counters and the overview's per-minute counts, in one round trip (the API
        keeps no tally)."""
        if not (samples or cells):
            return
        try:
            pipe = self.r.pipeline(transaction=False)
            queue_samples(pipe, samples)
            for key, name, amount in cells:
                pipe.hincrby(key, name, amount)
            for key in {key for key, _, _ in cells}:
                pipe.expire(key, recent.KEEP_S)
            await pipe.execute()
        except redis.RedisError as exc:
            log.warning("job %s: not counted in metrics: %s", job_id, exc)

    async def owner_of(self, job_id: str) -> str | None:
        """Whose job `job_id` is (None: no such job), without reading the whole job."""
        owner = await self.r.hget(keys.job(job_id), "owner")
        return None if owner is None else str(owner)

    async def cached_answer(self, owner: str, policy: CachePolicy) -> dict[str, Any] | None:
        """The response cache's answer to a request of this `policy`, if it has one: a job's
        output as `remember_answer` stored it (any kind's JSON)."""
        raw = await self.r.get(keys.response_cache(owner, policy.digest))
        return None if raw is None else dict(json.loads(raw))

    async def deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """The job's webhook delivery attempts, as the webhook worker records them
        (`cluster.webhooks.DeliveryRecord`, a layer above this one)."""
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
