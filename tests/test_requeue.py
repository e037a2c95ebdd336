"""The reaper's requeue and resend against real processes: a requeue pushes the job's
task message in the script that queues it (so a failure leaves the job as it was, and a
killed reaper loses nothing), and a queued job whose message went missing gets one."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from broker.kombu_redis import priority_lists, queued_job_ids
from broker.queues import queue_name
from harness.api_client import Api, new_owner
from jobs import keys
from tuning.deployment import Deployment, flush, serving, status_events, wait_until

LEASE = {"ttl_s": 1.5, "heartbeat_s": 0.3, "reaper_interval_s": 0.2, "max_attempts": 5}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    overrides = {f"MMQ_LEASE__{k.upper()}": str(v) for k, v in LEASE.items()}
    overrides["MMQ_METRICS_FLUSH_S"] = "0.2"
    deployment = Deployment(
        redis_url,
        tmp_path_factory.mktemp("requeue"),
        overrides,
        config_values={"echo_max_batch": 16, "echo_max_wait_ms": 100, "echo_concurrency": 16},
    )
    with serving(deployment):
        deployment.start_api()
        yield deployment


@pytest.fixture
def owner(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"requeue{time.monotonic_ns()}")


def _running_on_dead_worker(dep: Deployment, owner: Api, n: int) -> list[str]:
    """`n` echo jobs (one batch of 3 s) left running by a worker killed with SIGKILL."""
    worker = dep.start_worker("echo")
    ids = [owner.submit("echo", text=f"j{i}", sleep_ms=3000)["id"] for i in range(n)]
    wait_until(lambda: all(owner.get(j)["status"] == "running" for j in ids), worker)
    worker.kill()
    return ids


def _resent(dep: Deployment, reason: str) -> float:
    text = httpx.get(f"{dep.base_url}/metrics", timeout=10).text
    line = f'mmq_messages_resent_total{{reason="{reason}"}} '
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


def test_a_requeue_that_fails_leaves_the_job_as_it_was(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    (job_id,) = _running_on_dead_worker(dep, owner, 1)
    poisoned = priority_lists(queue_name("echo"))["normal"]
    rclient.set(poisoned, "not a list")  # the requeue's push fails: WRONGTYPE
    reaper = dep.start_reaper()
    wait_until(lambda: f"job {job_id}: could not take it back" in reaper.log(), reaper, 20)
    assert owner.get(job_id)["status"] == "running"
    assert status_events(rclient, job_id) == ["queued", "running"]
    assert not rclient.sismember(keys.queued("echo"), job_id)
    rclient.delete(poisoned)
    wait_until(lambda: owner.get(job_id)["status"] == "queued", reaper, 20)
    assert queued_job_ids(rclient, queue_name("echo")) == {job_id}  # queued with its message
    worker = dep.start_worker("echo")
    ended = owner.wait(job_id)
    assert ended["status"] == "succeeded" and ended["attempts"] == 2
    assert status_events(rclient, job_id) == ["queued", "running", "queued", "running", "succeeded"]
    worker.stop()
    reaper.stop()


def test_reapers_killed_at_random_moments_lose_no_job_and_end_none_twice(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    ids = _running_on_dead_worker(dep, owner, 12)
    rng = random.Random(17)
    kills = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(owner.get(j)["status"] == "running" for j in ids):
        reaper = dep.start_reaper()
        if kills % 2 == 0:  # any time in its start-up (over 1 s; more on a busy host)
            time.sleep(rng.uniform(0.3, 1.5))
        else:  # once it sweeps: before, during or after one of its first sweeps
            sweeping = f"[{reaper.process.pid}] reaper sweeping every"  # the log is shared
            wait_until(lambda r=reaper, line=sweeping: line in r.log(), reaper, 30)
            time.sleep(rng.uniform(0.0, 0.5))
        reaper.kill()
        reaper.process.wait(10)
        kills += 1
    assert kills >= 2
    assert all(owner.get(j)["status"] == "queued" for j in ids)
    assert queued_job_ids(rclient, queue_name("echo")) >= set(ids)
    worker = dep.start_worker("echo")
    for job_id in ids:
        ended = owner.wait(job_id)
        assert ended["status"] == "succeeded" and ended["attempts"] == 2
        statuses = status_events(rclient, job_id)
        assert statuses.count("succeeded") == 1 and statuses[-1] == "succeeded"
    worker.stop()


def test_a_queued_job_whose_message_went_missing_is_sent_again_once(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    lost = owner.submit("sleep", steps=1, step_ms=1)["id"]  # no sleep worker: they wait
    kept = owner.submit("sleep", steps=1, step_ms=1)["id"]
    queue = queue_name("sleep")
    waiting = priority_lists(queue)["normal"]
    assert queued_job_ids(rclient, queue) == {lost, kept}
    for raw in rclient.lrange(waiting, 0, -1):
        if lost in json.dumps(json.loads(raw)["headers"]):
            rclient.lrem(waiting, 1, raw)
    assert queued_job_ids(rclient, queue) == {kept}
    before = _resent(dep, "missing")
    reaper = dep.start_reaper()
    wait_until(lambda: queued_job_ids(rclient, queue) == {lost, kept}, reaper, 30)
    wait_until(lambda: _resent(dep, "missing") == before + 1, reaper, 10)
    assert rclient.llen(waiting) == 2  # one message each: the intact one was left alone
    worker = dep.start_worker("sleep")
    for job_id in (lost, kept):
        assert owner.wait(job_id)["status"] == "succeeded"
        assert status_events(rclient, job_id).count("running") == 1
    worker.stop()
    reaper.stop()
