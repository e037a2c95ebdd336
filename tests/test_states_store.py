"""The state machine and the job store's guarded transitions, against real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
from pydantic import ValidationError

from broker.celery_app import job_message, make_celery
from harness.pipelines import EchoInput, EchoPipeline
from jobs import keys
from jobs.models import EventType, Job, WebhookSpec
from jobs.schemas.llm_options import LlmOptions
from jobs.settings import PipelineConfig, Settings, load_settings
from jobs.states import TRANSITIONS, InvalidTransition, JobStatus, check_transition
from jobstore import notices, operations
from jobstore.changes import ALL_FIELDS, Lease, transition
from jobstore.codec import job_from_fields, job_to_fields
from jobstore.lua import NOTICE_JOB_MAX_BYTES
from jobstore.store import AsyncJobStore, JobStore
from workers.engine import Engine
from workers.event_writer import EventWriter
from workers.jobrunner import JobRunner
from workers.leases import LeaseKeeper

ALLOWED = {
    ("queued", "running"),
    ("queued", "canceled"),
    ("queued", "expired"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "canceled"),
    ("running", "queued"),
}


@pytest.mark.parametrize("current", list(JobStatus))
@pytest.mark.parametrize("target", list(JobStatus))
def test_the_table_allows_exactly_the_design_transitions(
    current: JobStatus, target: JobStatus
) -> None:
    if (current.value, target.value) in ALLOWED:
        check_transition(current, target)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(current, target)
    assert (target in TRANSITIONS[current]) == ((current.value, target.value) in ALLOWED)


@pytest.fixture
def store(redis_url: str) -> JobStore:
    settings = Settings(redis_url=redis_url, job_ttl_s=60)
    return JobStore(redis.Redis.from_url(redis_url, decode_responses=True), settings)


def put_echo_job(store: JobStore, status: JobStatus = JobStatus.QUEUED, **extra: str) -> Job:
    """An `echo` job stored as it is (no script), with `extra` fields on its record."""
    now = time.time()
    job = Job(
        id=f"job_t{time.monotonic_ns()}",
        kind="echo",
        pipeline="echo",
        status=status,
        owner="o",
        priority="normal",
        input={},
        created_at=now,
        queued_at=now,
    )
    store.r.hset(keys.job(job.id), mapping={**job_to_fields(job), **extra})
    return job


def test_start_takes_the_lease_once(store: JobStore) -> None:
    job = put_echo_job(store)
    first = Lease("a", 5000)
    second = Lease("b", 5000)
    q = frozenset({JobStatus.QUEUED})
    ok = store.apply(
        transition(job, JobStatus.RUNNING, sources=q, lease_mode="acquire", lease=first)
    )
    assert ok.ok and ok.event_id
    again = store.apply(
        transition(job, JobStatus.RUNNING, sources=q, lease_mode="acquire", lease=second)
    )
    assert not again.ok and again.reason == "status" and again.status == "running"
    assert store.r.get(keys.lease(job.id)) == "a"
    assert store.r.zscore(keys.RUNNING, job.id) is not None
    stored = store.get(job.id)
    assert stored is not None and stored.attempts == 1


def test_only_the_lease_holder_records_the_end(store: JobStore) -> None:
    job = put_echo_job(store)
    lease = Lease("holder", 5000)
    store.apply(transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=lease))
    r = frozenset({JobStatus.RUNNING})
    stranger = store.apply(
        transition(job, JobStatus.SUCCEEDED, sources=r, lease_mode="check", lease=Lease("x", 1))
    )
    assert not stranger.ok and stranger.reason == "lease"
    done = store.apply(
        transition(
            job,
            JobStatus.SUCCEEDED,
            sources=r,
            lease_mode="check",
            lease=lease,
            fields={"output": json.dumps({"v": 1})},
            pre_event=(EventType.OUTPUT, {"v": 1}),
        )
    )
    assert done.ok
    assert store.r.exists(keys.lease(job.id)) == 0
    assert 0 < store.r.ttl(keys.job(job.id)) <= 60
    assert 0 < store.r.ttl(keys.job_events(job.id)) <= 60
    events = store.events(job.id)
    assert [(e.type.value, e.data.get("status")) for e in events] == [
        ("status", "running"),
        ("output", None),
        ("status", "succeeded"),
    ]
    ended = store.get(job.id)
    assert ended is not None and ended.first_output_at is not None
    late = store.apply(transition(job, JobStatus.FAILED, sources=r))
    assert not late.ok and late.reason == "status"


def test_a_transition_reads_back_the_fields_it_is_asked_for(store: JobStore) -> None:
    job = put_echo_job(store)
    fields = ("status", "started_at", "first_output_at")
    change = replace(
        transition(job, JobStatus.CANCELED, fields={"started_at": "12.5"}), read_back=fields
    )
    done = store.apply(change)
    assert done.ok
    assert done.read_back == {"status": "canceled", "started_at": "12.5", "first_output_at": ""}
    again = store.apply(change)
    assert not again.ok and again.read_back == {}


def test_the_start_reads_back_the_whole_job(store: JobStore) -> None:
    job = put_echo_job(store)
    start = replace(
        transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=Lease("w", 5000)),
        read_back=ALL_FIELDS,
    )
    started = store.apply(start)
    assert started.ok
    assert job_from_fields(started.read_back) == job.model_copy(
        update={"status": JobStatus.RUNNING, "attempts": 1}
    )


def _end_notices(store: JobStore, job: Job) -> dict[str, dict[str, Any]]:
    """The end notices published when `job` (running) is canceled, by channel."""
    pubsub = store.r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.EVENTS_CHANNEL, keys.ENDS_CHANNEL)
    found: dict[str, dict[str, Any]] = {}
    try:
        for _ in range(2):  # the subscribe replies: subscribed from here on
            pubsub.get_message(timeout=1)
        assert store.apply(transition(job, JobStatus.CANCELED)).ok
        deadline = time.monotonic() + 5
        while len(found) < 2 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1)
            if message is None:
                continue
            notice: dict[str, Any]
            if message["channel"] == keys.EVENTS_CHANNEL:  # a line per event
                (event,) = [notices.event_of(line) for line in notices.event_lines(message["data"])]
                notice = {"id": event.id, "job_id": event.job_id, "type": event.type}
                notice |= {"data": event.data}
            else:
                notice = json.loads(message["data"])
            if notice.get("job_id") == job.id and notice["type"] == "status":
                found[message["channel"]] = notice
    finally:
        pubsub.close()
    assert set(found) == {keys.EVENTS_CHANNEL, keys.ENDS_CHANNEL}, found
    return found


def test_the_end_notice_carries_the_job_on_the_ends_channel_unless_large(
    store: JobStore,
) -> None:
    small = put_echo_job(store)
    notices = _end_notices(store, small)
    event, end = notices[keys.EVENTS_CHANNEL], notices[keys.ENDS_CHANNEL]
    assert event["data"] == end["data"] == {"status": "canceled"} and event["id"] == end["id"]
    assert "job" not in event  # followers get the event alone, as in the stream
    carried = job_from_fields(end["job"])
    assert carried == store.get(small.id) and carried.status is JobStatus.CANCELED
    assert "job" not in store.events(small.id)[-1].data

    large = put_echo_job(store)
    store.r.hset(keys.job(large.id), "input", json.dumps({"text": "x" * NOTICE_JOB_MAX_BYTES}))
    end = _end_notices(store, large)[keys.ENDS_CHANNEL]
    assert end["data"] == {"status": "canceled"} and "job" not in end


def test_only_an_end_goes_to_the_ends_channel(store: JobStore) -> None:
    job = put_echo_job(store)
    pubsub = store.r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.ENDS_CHANNEL)
    try:
        pubsub.get_message(timeout=1)
        lease = Lease("w", 5000)
        start = transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=lease)
        assert store.apply(start).ok
        store.append_event(job.id, EventType.PROGRESS, {"step": 1}, first_output=False)
        running = frozenset({JobStatus.RUNNING})
        end = transition(job, JobStatus.SUCCEEDED, sources=running, lease_mode="check", lease=lease)
        assert store.apply(end).ok
        message = pubsub.get_message(timeout=5)
        assert message is not None
        assert json.loads(message["data"])["data"] == {"status": "succeeded"}
        assert pubsub.get_message(timeout=0.3) is None
    finally:
        pubsub.close()


def test_the_reaper_path_needs_an_expired_lease(store: JobStore) -> None:
    job = put_echo_job(store)
    store.apply(transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=Lease("w", 300)))
    r = frozenset({JobStatus.RUNNING})
    early = store.apply(transition(job, JobStatus.QUEUED, sources=r, lease_mode="absent"))
    assert not early.ok and early.reason == "lease"
    time.sleep(0.4)
    late = store.apply(transition(job, JobStatus.QUEUED, sources=r, lease_mode="absent"))
    assert late.ok
    assert store.r.sismember(keys.queued("echo"), job.id)


def test_a_preempted_run_gives_its_job_back_under_its_lease_without_an_attempt(
    store: JobStore,
) -> None:
    job = put_echo_job(store)
    assert not store.request_preempt(job.id)  # only a running job is asked to stop
    lease = Lease("w", 5000)
    started = store.apply(operations.start(job.id, "echo", lease, "w"))
    running = job_from_fields(started.read_back)
    assert store.request_preempt(job.id)
    assert store.stop_requested([job.id]) == {job.id} and store.preempted(job.id)
    message = job_message(make_celery(store.settings), running)
    stranger = store.apply(operations.requeue_preempted(running, Lease("x", 1), message))
    assert not stranger.ok and stranger.reason == "lease"
    assert store.apply(operations.requeue_preempted(running, lease, message)).ok
    again = store.get(job.id)
    assert again is not None and again.status is JobStatus.QUEUED and again.attempts == 0
    assert store.r.exists(keys.lease(job.id)) == 0  # the next start takes it at once
    assert store.r.hget(keys.job(job.id), "preempt_requested") == ""
    assert store.r.lrange(message.list_key, 0, -1).count(message.envelope) == 1
    (last,) = [e for e in store.events(job.id) if e.type is EventType.STATUS][-1:]
    assert last.data == {"status": "queued", "reason": "preempted"}
    assert store.apply(operations.start(job.id, "echo", Lease("w2", 5000), "w2")).ok
    assert store.request_preempt(job.id)
    store.request_cancel(job.id)  # a cancel (or the batch window's end) wins over a stop
    assert store.stop_requested([job.id]) == {job.id} and not store.preempted(job.id)


def test_a_cancel_requested_before_start_wins(store: JobStore) -> None:
    job = put_echo_job(store)
    store.r.hset(keys.job(job.id), "cancel_requested", "1")
    result = store.apply(
        transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=Lease("w", 1000))
    )
    assert not result.ok and result.reason == "canceled"


def test_a_transition_the_table_refuses_never_reaches_redis(store: JobStore) -> None:
    job = put_echo_job(store, JobStatus.SUCCEEDED)
    with pytest.raises(InvalidTransition):
        store.apply(transition(job, JobStatus.RUNNING, sources=frozenset({JobStatus.SUCCEEDED})))


def test_settings_env_over_toml_over_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "mmq.toml"
    config.write_text(
        '[api]\nport = 9001\nmax_wait_s = 5\n[pipelines.x]\nkind = "noop"\n'
        'impl = "pipelines.noop:NoopPipeline"\nmax_batch = 4\n'
    )
    monkeypatch.setenv("MMQ_API__PORT", "9002")
    monkeypatch.setenv("MMQ_LEASE__TTL_S", "7.5")
    settings = load_settings(config)
    assert settings.api.port == 9002
    assert settings.api.max_wait_s == 5
    assert settings.lease.ttl_s == 7.5
    assert settings.pipelines["x"].max_batch == 4
    assert settings.enabled_kinds == ["noop"]


def test_pipeline_options_are_validated_as_the_pipelines_own_class() -> None:
    config = PipelineConfig(kind="llm", impl="x:Y", options={"max_inflight": 3})
    assert config.options_as(LlmOptions).max_inflight == 3
    changed = config.model_copy(update={"options": {"max_inflight": 5}})
    assert changed.options_as(LlmOptions).max_inflight == 5
    with pytest.raises(ValidationError, match="max_inflight"):
        PipelineConfig(kind="llm", impl="x:Y", options={"max_inflight": 0}).options_as(LlmOptions)


def test_auth_may_be_off_only_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MMQ_API__HOST", "0.0.0.0")
    with pytest.raises(ValueError, match=r"auth\.required"):
        load_settings()
    monkeypatch.setenv("MMQ_AUTH__REQUIRED", "true")
    assert load_settings().api.host == "0.0.0.0"


def test_submit_stores_every_field_as_given(redis_url: str) -> None:
    """The submit script gets the job's fields as one JSON argument: any text survives."""
    now = time.time()
    text = 'héllo 日本 "quoted" \\ back\nslash \u0000 nul 🎉'
    job = Job(
        id=f"job_s{time.monotonic_ns()}", kind="echo", pipeline="echo", status=JobStatus.QUEUED,
        owner="o", priority="high", input={"text": text}, metadata={"k": text},
        created_at=now, queued_at=now,
    )  # fmt: skip

    async def submit() -> tuple[str, Job | None]:
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        store = AsyncJobStore(client, Settings(redis_url=redis_url))
        try:
            result = await store.submit(job, message=None, max_queued=10)
            return result.outcome, await store.get(job.id)
        finally:
            await client.aclose()

    outcome, stored = asyncio.run(submit())
    assert outcome == "ok"
    assert stored == job


def test_a_worker_ends_a_job_canceled_while_queued_with_its_webhook_event(
    store: JobStore,
) -> None:
    """The API set the cancel flag but had not recorded the end when a worker took the
    task: the worker records it, and the job's webhook gets the end."""
    sent: list[tuple[str, str, dict[str, Any]]] = []
    settings = store.settings
    store = JobStore(store.r, settings, on_event=lambda *call: sent.append(call))
    job = put_echo_job(store)
    hook = WebhookSpec(url="https://hooks.example/end")
    store.r.hset(
        keys.job(job.id), mapping={"cancel_requested": "1", "webhook": hook.model_dump_json()}
    )
    config = PipelineConfig(kind="echo", impl="harness.pipelines:EchoPipeline")
    engine = Engine(EchoPipeline(config, settings), name="echo")
    keeper = LeaseKeeper(store, settings, "w", {})
    runner = JobRunner(store, engine, keeper, EventWriter(store), EchoInput, "w")
    assert runner.run(job.id) == "dropped:canceled"
    ended = store.get(job.id)
    assert ended is not None and ended.status is JobStatus.CANCELED and ended.finished_at
    assert [(url, e["data"]["status"]) for _, url, e in sent] == [(hook.url, "canceled")]
