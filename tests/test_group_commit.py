"""Group commit (`common.combining`, `jobstore.group_commit`): the changes that a worker's
threads ask for at once are made in one script call, each with the answer it would get
alone, against real Redis; and a worker's acknowledgements go together the same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
import redis

from common.combining import Combiner
from jobs import keys
from jobs.models import Job
from jobs.settings import Settings
from jobs.states import JobStatus
from jobstore import operations
from jobstore.changes import Lease
from jobstore.codec import job_to_fields
from jobstore.group_commit import GroupCommit
from jobstore.store import JobStore


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


def _put(store: JobStore, status: JobStatus = JobStatus.QUEUED, **extra: str) -> Job:
    now = time.time()
    job = Job(
        id=f"job_g{time.monotonic_ns()}",
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


def test_apply_many_makes_each_change_as_apply_would(store: JobStore) -> None:
    queued, canceled, running = _put(store), _put(store, cancel_requested="1"), _put(store)
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
    good = _put(store)
    broken = _put(store)
    store.r.delete(keys.job_events(broken.id))
    store.r.set(keys.job_events(broken.id), "not a stream")  # its XADD raises
    lease = Lease("l", 5000)
    dones = store.apply_many([operations.start(j.id, "echo", lease, "w") for j in (broken, good)])
    with pytest.raises(redis.ResponseError, match=broken.id):
        dones[0].result()
    assert dones[1].result().ok
    assert store.r.get(keys.lease(good.id)) == "l"


def test_group_commit_starts_a_burst_of_jobs_in_fewer_calls(store: JobStore) -> None:
    jobs = [_put(store) for _ in range(64)]
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
