"""Group commit (`common.combining`, `jobstore.group_commit`): the changes that a worker's
threads ask for at once are made in one script call, each with the answer it would get
alone, against real Redis; and a worker's acknowledgements go together the same way."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import pytest
import redis

from broker.celery_app import job_message, make_celery
from broker.kombu_redis import queued_job_ids
from broker.queues import queue_name
from common.combining import Combiner
from harness.pipelines import EchoInput, EchoPipeline
from jobs import keys
from jobs.models import Job
from jobs.settings import PipelineConfig, Settings
from jobstore import operations
from jobstore.changes import Lease
from jobstore.group_commit import GroupCommit
from jobstore.store import JobStore
from tests.test_states_store import put_echo_job
from workers.engine import Engine
from workers.event_writer import EventWriter
from workers.jobrunner import JobRunner
from workers.leases import LeaseKeeper


def test_a_combiner_groups_what_threads_ask_meanwhile_and_answers_each_its_own() -> None:
    groups: list[int] = []
    gate = threading.Event()

    def doubled(requests: Sequence[int]) -> list[int]:
        groups.append(len(requests))
        gate.wait(5)  # the first call is held until every other thread has queued
        return [r * 2 for r in requests]

    combiner: Combiner[int, int] = Combiner(doubled)
    replies: dict[int, int] = {}
    threads = [
        threading.Thread(target=lambda n=n: replies.__setitem__(n, combiner.call(n)))
        for n in range(40)
    ]
    threads[0].start()
    deadline = time.monotonic() + 5
    while not groups and time.monotonic() < deadline:  # the first call is in flight
        time.sleep(0.001)
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 5
    while len(combiner._queue) < 39 and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(5)
    assert replies == {n: n * 2 for n in range(40)}
    assert groups == [1, 39]  # the 39 that waited behind the first went in one call
    assert combiner.calls == 2


def test_a_combiner_fails_only_the_group_whose_call_raised() -> None:
    def picky(requests: Sequence[int]) -> list[int]:
        if any(r < 0 for r in requests):
            raise ValueError("negative")
        return list(requests)

    combiner: Combiner[int, int] = Combiner(picky)
    with pytest.raises(ValueError, match="negative"):
        combiner.call(-1)
    assert combiner.call(3) == 3  # the lead was handed on: the next call runs


@pytest.fixture
def store(redis_url: str) -> JobStore:
    settings = Settings(redis_url=redis_url, job_ttl_s=60)
    return JobStore(redis.Redis.from_url(redis_url, decode_responses=True), settings)


def test_apply_many_makes_each_change_as_apply_would(store: JobStore) -> None:
    queued, canceled, running = (
        put_echo_job(store),
        put_echo_job(store, cancel_requested="1"),
        put_echo_job(store),
    )
    assert store.apply(operations.start(running.id, "echo", Lease("first", 5000), "w")).ok
    lease = Lease("mine", 5000)
    starts = [operations.start(j.id, "echo", lease, "w") for j in (queued, canceled, running)]
    started, refused, taken = (done.result() for done in store.apply_many(starts))
    assert started.ok and started.read_back["status"] == "running"
    assert started.read_back["attempts"] == "1"
    assert (refused.ok, refused.reason) == (False, "canceled")
    assert (taken.ok, taken.reason, taken.status) == (False, "status", "running")
    assert store.r.get(keys.lease(queued.id)) == "mine"
    assert store.r.get(keys.lease(running.id)) == "first"  # untouched by the refused start
    # An end and a stranger's end in one call: only the lease holder's is made.
    job = store.get(queued.id)
    assert job is not None
    ends = [
        operations.succeed(job, Lease("stranger", 5000), {"text": "other"}),
        operations.succeed(job, lease, {"text": "done"}),
        operations.succeed(job, lease, {"text": "again"}),
    ]
    stranger, ended, again = (done.result() for done in store.apply_many(ends))
    assert (stranger.ok, stranger.reason) == (False, "lease")
    assert ended.ok and (again.ok, again.reason) == (False, "status")  # never ends twice
    after = store.get(queued.id)
    assert after is not None and after.status == "succeeded" and after.output == {"text": "done"}
    assert [e.type for e in store.events(queued.id)][-2:] == ["output", "status"]


def test_a_change_that_raises_in_the_script_fails_alone(store: JobStore) -> None:
    good = put_echo_job(store)
    broken = put_echo_job(store)
    store.r.delete(keys.job_events(broken.id))
    store.r.set(keys.job_events(broken.id), "not a stream")  # its XADD raises
    lease = Lease("l", 5000)
    dones = store.apply_many([operations.start(j.id, "echo", lease, "w") for j in (broken, good)])
    with pytest.raises(redis.ResponseError, match=broken.id):
        dones[0].result()
    assert dones[1].result().ok
    assert store.r.get(keys.lease(good.id)) == "l"


def test_group_commit_starts_a_burst_of_jobs_in_fewer_calls(store: JobStore) -> None:
    jobs = [put_echo_job(store) for _ in range(64)]
    commits = GroupCommit(store)
    results: dict[str, bool] = {}
    barrier = threading.Barrier(len(jobs))

    def start(job: Job) -> None:
        barrier.wait(5)
        change = operations.start(job.id, "echo", Lease(f"l-{job.id}", 5000), "w")
        results[job.id] = commits.apply(change).ok

    threads = [threading.Thread(target=start, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {job.id: True for job in jobs}
    assert all(store.r.get(keys.lease(job.id)) == f"l-{job.id}" for job in jobs)
    assert commits.calls < len(jobs)


def _runner(store: JobStore) -> JobRunner:
    settings = store.settings
    config = PipelineConfig(kind="echo", impl="harness.pipelines:EchoPipeline")
    engine = Engine(EchoPipeline(config, settings), name="echo")
    keeper = LeaseKeeper(store, settings, "w", {})
    writer = EventWriter(store)
    app = make_celery(settings)
    runner = JobRunner(
        store, engine, keeper, writer, EchoInput, "w", message_for=lambda j: job_message(app, j)
    )
    writer.start()
    engine.start()
    keeper.start()
    return runner


def test_an_intake_is_started_in_one_call_and_each_run_takes_its_start_up(
    store: JobStore,
) -> None:
    jobs = [put_echo_job(store, input=json.dumps({"text": f"t{n}"})) for n in range(3)]
    canceled = put_echo_job(store, cancel_requested="1")
    runner = _runner(store)
    try:
        assert runner.prestarts  # no residency: it runs every job it is handed
        before = _transition_calls(store)
        runner.prestart([j.id for j in [*jobs, canceled, jobs[0]]])  # a job twice: once
        assert _transition_calls(store) == before + 1
        assert runner.active() == 4  # started with the intake, not run yet
        for job in jobs:
            stored = store.get(job.id)
            assert stored is not None and stored.status == "running" and stored.attempts == 1
        assert [runner.run(j.id) for j in jobs] == ["ran"] * 3
        assert runner.run(canceled.id) == "dropped:canceled"
        assert runner.active() == 0
        for job in jobs:
            ended = store.get(job.id)
            assert ended is not None and ended.status == "succeeded" and ended.attempts == 1
            starts = [e for e in store.events(job.id) if e.data.get("status") == "running"]
            assert len(starts) == 1  # started once: the run made no start of its own
        # A run that finds no start of its job makes its own.
        alone = put_echo_job(store, input=json.dumps({"text": "alone"}))
        assert runner.run(alone.id) == "ran"
    finally:
        runner.engine.stop()
        runner.keeper.stop()
        runner.events.stop()


def test_a_job_started_with_its_intake_is_handed_back_if_the_runner_closed_first(
    store: JobStore,
) -> None:
    job = put_echo_job(store, input=json.dumps({"text": "late"}))
    runner = _runner(store)
    try:
        runner.prestart([job.id])
        runner.close()
        assert runner.run(job.id) == "handed-back"
        stored = store.get(job.id)
        assert stored is not None and stored.status == "queued" and stored.attempts == 0
        assert store.r.get(keys.lease(job.id)) is None
        assert job.id in queued_job_ids(store.r, queue_name("echo"))  # its new message
        assert runner.active() == 0
    finally:
        runner.engine.stop()
        runner.keeper.stop()
        runner.events.stop()


def _transition_calls(store: JobStore) -> int:
    """Script calls made so far (Redis counts every EVALSHA; nothing else calls one while
    no job runs)."""
    stats = store.r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
