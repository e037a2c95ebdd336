"""`JobStore` (workers, the reaper) and `AsyncJobStore` (the API) answer alike: the same
sequence of operations, run once through each against a real Redis (flushed between the
two, with the same jobs and the same changes), gives the same answers, the same
exceptions, the same webhook events handed on and the same metric counts.

Durability: the test server has no replica, so at `redis.durability = replica` its `WAIT`
confirms nothing, and at `fsync` it refuses `WAITAOF` (no append-only file): a write that
Redis made raises `NotDurable` in both stores once what it implies is done; a write that
the script refused (a full queue, a lease not held) answers as usual.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aredis
from pydantic import BaseModel

from broker.celery_app import job_message, make_celery
from jobs import keys
from jobs.errors import NotDurable
from jobs.models import Event, Job, WebhookSpec
from jobs.settings import Durability, RedisSettings, Settings
from jobs.states import InvalidTransition, JobStatus
from jobstore import operations
from jobstore.changes import Lease, transition
from jobstore.store import AsyncJobStore, JobStore
from telemetry.metric_defs import JOBS_FINISHED, JOBS_REJECTED, JOBS_SUBMITTED
from tuning.deployment import flush

HOOK = WebhookSpec(url="https://hooks.example/parity", events=["all"])
COUNTED = (JOBS_SUBMITTED, JOBS_FINISHED, JOBS_REJECTED)
STREAM_ID = re.compile(r"\d+-\d+")

Transcript = list[tuple[str, Any]]
Handed = list[tuple[str, str, dict[str, Any]]]


class Calls:
    """A store's operations by name, awaited where the store is async."""

    def __init__(self, store: JobStore | AsyncJobStore) -> None:
        self.store = store
        self.transcript: Transcript = []

    async def __call__(self, label: str, name: str, *args: Any, **kwargs: Any) -> Any:
        """The answer of `store.name(*args, **kwargs)`, or the exception it raised (also
        written down under `label`)."""
        try:
            answer = getattr(self.store, name)(*args, **kwargs)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception as exc:
            self.transcript.append((label, ("raises", type(exc).__name__, str(exc))))
            return exc
        self.transcript.append((label, answer))
        return answer


def _job(name: str, webhook: WebhookSpec | None = HOOK) -> Job:
    now = time.time()
    return Job(
        id=f"job_parity_{name}", kind="echo", pipeline="echo", status=JobStatus.QUEUED,
        owner="parity", priority="normal", input={"text": name}, webhook=webhook,
        created_at=now, queued_at=now,
    )  # fmt: skip


def _settings(redis_url: str, durability: Durability = "memory") -> Settings:
    redis_settings = RedisSettings(durability=durability, durability_timeout_ms=50)
    return Settings(redis_url=redis_url, job_ttl_s=60, redis=redis_settings)


def _plain(value: Any, now: float) -> Any:
    """`value` as plain data to compare between the two runs: stream ids as `<id>` (two
    streams may give the same one), times of this run (events' `ts`, `first_output_at`)
    as `<time>`."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, Event):  # a slotted object, not a model
        value = {k: getattr(value, k) for k in ("id", "job_id", "type", "data", "ts")}
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {"type": type(value).__name__, **dataclasses.asdict(value)}
    if isinstance(value, dict):
        return {k: _plain(v, now) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, now) for v in value]
    if isinstance(value, str):
        if STREAM_ID.fullmatch(value):
            return "<id>"
        if value.startswith("{"):  # a notice held back, a JSON field read back
            return _plain(json.loads(value), now)
        try:
            value = float(value)
        except ValueError:
            return value
    if isinstance(value, float) and abs(value - now) < 3600:
        return "<time>"
    return value


def _counts(r: redis.Redis) -> dict[str, dict[Any, Any]]:
    return {m.name: dict(r.hgetall(keys.metric(m.name))) for m in COUNTED}


Scenario = Callable[[Calls, Settings], Awaitable[None]]


async def _run(
    redis_url: str, settings: Settings, scenario: Scenario, asynchronous: bool
) -> tuple[Any, Any, dict[str, dict[Any, Any]]]:
    """The transcript of `scenario` on a fresh database through one store, the webhook
    events it handed on and the metric counts it wrote (all as plain data)."""
    flush(redis_url)
    handed: Handed = []

    def on_event(job_id: str, url: str, event: dict[str, Any]) -> None:
        handed.append((job_id, url, event))

    r = redis.Redis.from_url(redis_url, decode_responses=True)
    if asynchronous:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        astore = AsyncJobStore(client, settings, on_event, metered=True)
        try:
            calls = Calls(astore)
            await scenario(calls, settings)
        finally:
            await client.aclose()
    else:
        store = JobStore(r, settings, on_event, metered=True)
        calls = Calls(store)
        await scenario(calls, settings)
        assert store.tally.flush()  # a sync store's counts wait in its tally
    now = time.time()
    return _plain(calls.transcript, now), _plain(handed, now), _counts(r)


def _both(redis_url: str, settings: Settings, scenario: Scenario) -> Any:
    """`scenario` through each store: what each answered, the same."""

    async def main() -> tuple[Any, Any]:
        sync = await _run(redis_url, settings, scenario, asynchronous=False)
        async_ = await _run(redis_url, settings, scenario, asynchronous=True)
        return sync, async_

    sync, async_ = asyncio.run(main())
    for part, mine, theirs in zip(("answers", "webhooks", "counts"), sync, async_, strict=True):
        if part == "answers":
            for (label, a), (label_b, b) in zip(mine, theirs, strict=True):
                assert label == label_b and a == b, (label, a, b)
        assert mine == theirs, part
    transcript, handed, counts = sync
    return dict(transcript), handed, counts


def test_both_stores_give_the_same_answers_and_errors(redis_url: str) -> None:
    a, b, c = _job("a"), _job("b"), _job("c")
    d, e = _job("d", webhook=None), _job("e", webhook=None)
    lease, stranger = Lease("parity-worker", 5000), Lease("parity-stranger", 5000)
    start_a = operations.start(a.id, a.kind, lease, "w")
    running_a = a.model_copy(update={"status": JobStatus.RUNNING, "attempts": 1})
    output = {"text": "A"}
    by_stranger = operations.succeed(running_a, stranger, output)
    succeed_a = operations.succeed(running_a, lease, output)
    fail_a = operations.fail(running_a, lease, {"type": "x", "message": "late"})
    start_b = operations.start(b.id, b.kind, Lease("parity-b", 5000), "w")
    cancel_b = operations.cancel_queued(b)
    ghost = operations.cancel_queued(_job("ghost"))
    refused = transition(a, JobStatus.RUNNING, sources=frozenset({JobStatus.SUCCEEDED}))

    async def scenario(call: Calls, settings: Settings) -> None:
        celery = make_celery(settings)
        await call("submit a", "submit", a, job_message(celery, a), 2)
        await call("submit b", "submit", b, job_message(celery, b), 2)
        await call("submit c: queue full", "submit", c, job_message(celery, c), 2)
        await call("submit d", "submit", d, None, 10, idempotency=("key", "h1"))
        await call("submit e: key used", "submit", e, None, 10, idempotency=("key", "h2"))
        await call("get a", "get", a.id)
        await call("get missing", "get", "job_parity_nobody")
        await call("start a", "apply", start_a)
        await call("end a by a stranger", "apply", by_stranger)
        ended = await call("end a", "apply", succeed_a)
        await call("end a again", "apply", fail_a)
        await call("request cancel b", "request_cancel", b.id)
        await call("get b", "get", b.id)
        await call("start b: canceled", "apply", start_b)
        await call("cancel b", "apply", cancel_b)
        await call("cancel a missing job", "apply", ghost)
        await call("a change the table refuses", "apply", refused)
        events = await call("events a", "events", a.id)
        assert [ended.pre_event_id, ended.event_id] == [e.id for e in events[-2:]]
        await call("events a after the first", "events", a.id, events[0].id)
        await call("events b", "events", b.id)
        await call("events after the last", "events", a.id, events[-1].id)

    answers, handed, counts = _both(redis_url, _settings(redis_url), scenario)
    assert answers["submit a"]["outcome"] == answers["submit b"]["outcome"] == "ok"
    assert answers["submit c: queue full"]["outcome"] == "full"
    assert answers["submit e: key used"] == {
        "type": "SubmitResult", "outcome": "dup", "job_id": d.id, "body_hash": "h1",
        "quota": "", "limit": 0, "used": 0, "cost_limit": 0, "cost_used": 0,
    }  # fmt: skip
    assert answers["get missing"] is None and answers["get a"]["status"] == "queued"
    assert answers["start a"]["ok"] and answers["start a"]["read_back"]["status"] == "running"
    assert answers["end a by a stranger"]["reason"] == "lease"
    assert answers["end a"]["ok"]
    assert answers["end a again"]["reason"] == "status"
    assert answers["get b"]["cancel_requested"] is True
    assert answers["start b: canceled"]["reason"] == "canceled"
    assert answers["cancel b"]["ok"]
    assert answers["cancel a missing job"]["reason"] == "missing"
    assert answers["a change the table refuses"][:2] == ["raises", InvalidTransition.__name__]
    statuses = [(e["type"], e["data"].get("status")) for e in answers["events a"]]
    assert statuses == [("status", "queued"), ("status", "running"), ("output", None),
                        ("status", "succeeded")]  # fmt: skip
    assert answers["events a after the first"] == answers["events a"][1:]
    assert answers["events after the last"] == []
    # Each store hands on the same webhook events: a's and b's (d and e have none).
    assert [(job, e["type"], e["data"].get("status")) for job, _, e in handed] == [
        (a.id, "status", "queued"), (b.id, "status", "queued"), (a.id, "status", "running"),
        (a.id, "output", None), (a.id, "status", "succeeded"), (b.id, "status", "canceled"),
    ]  # fmt: skip
    # Metered, each counts the same submits, ends and refusals (the sync one in its tally).
    assert sum(map(int, counts[JOBS_SUBMITTED.name].values())) == 3
    assert sum(map(int, counts[JOBS_FINISHED.name].values())) == 2
    assert sum(map(int, counts[JOBS_REJECTED.name].values())) == 1


def test_a_write_redis_does_not_confirm_raises_the_same_error_in_both_stores(
    redis_url: str,
) -> None:
    """`replica` with no replica: a submit that stored its job and an end that was made
    raise `NotDurable`, after what they imply (the job is there, its webhook events handed
    on, the end counted); a refused submit or end answers as usual."""
    x, y = _job("x"), _job("y")
    lease = Lease("parity-worker", 5000)
    running_x = x.model_copy(update={"status": JobStatus.RUNNING, "attempts": 1})

    async def scenario(call: Calls, settings: Settings) -> None:
        celery = make_celery(settings)
        await call("submit x", "submit", x, job_message(celery, x), 1)
        await call("get x", "get", x.id)
        await call("submit y: queue full", "submit", y, job_message(celery, y), 1)
        await call("start x", "apply", operations.start(x.id, x.kind, lease, "w"))
        stranger = operations.succeed(running_x, Lease("parity-stranger", 5000), {})
        await call("end x by a stranger", "apply", stranger)
        await call("end x", "apply", operations.succeed(running_x, lease, {"text": "X"}))
        await call("get x at the end", "get", x.id)
        await call("events x", "events", x.id)

    settings = _settings(redis_url, "replica")
    answers, handed, counts = _both(redis_url, settings, scenario)
    assert answers["submit x"][:2] == ["raises", NotDurable.__name__]
    assert f"job {x.id} was written but not confirmed on 1 replica(s)" in answers["submit x"][2]
    assert answers["get x"]["status"] == "queued"
    assert answers["submit y: queue full"]["outcome"] == "full"
    assert answers["start x"]["ok"]  # not an end: no wait
    assert answers["end x by a stranger"]["reason"] == "lease"
    assert answers["end x"][:2] == ["raises", NotDurable.__name__]
    assert f"the end of job {x.id} was written" in answers["end x"][2]
    assert answers["get x at the end"]["status"] == "succeeded"
    assert [e["data"].get("status") for e in answers["events x"]][-1] == "succeeded"
    assert [(e["type"], e["data"].get("status")) for _, _, e in handed] == [
        ("status", "queued"),
        ("status", "running"),
        ("output", None),
        ("status", "succeeded"),
    ]
    assert sum(map(int, counts[JOBS_SUBMITTED.name].values())) == 1
    assert sum(map(int, counts[JOBS_FINISHED.name].values())) == 1
    assert sum(map(int, counts[JOBS_REJECTED.name].values())) == 1


def test_a_server_that_refuses_the_wait_raises_the_same_error_in_both_stores(
    redis_url: str,
) -> None:
    """`fsync` on a server without an append-only file: `WAITAOF` is refused; the submit
    that stored its job says so, in both stores alike."""
    z = _job("z", webhook=None)

    async def scenario(call: Calls, settings: Settings) -> None:
        await call("submit z", "submit", z, job_message(make_celery(settings), z), 5)
        await call("get z", "get", z.id)

    answers, _, _ = _both(redis_url, _settings(redis_url, "fsync"), scenario)
    kind, error, message = answers["submit z"]
    assert (kind, error) == ("raises", NotDurable.__name__)
    assert "the server refused" in message
    assert answers["get z"]["status"] == "queued"
