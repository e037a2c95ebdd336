"""Leases and the reaper against real worker processes killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from celery import Celery

from broker.celery_app import make_celery
from broker.kombu_redis import UNACKED
from broker.queues import TASK_NAME, queue_name
from harness.api_client import Api, new_owner
from host.launcher import ProcSpec, Supervisor, mmq_command
from jobs import keys
from jobs.models import Job
from jobs.settings import load_settings
from jobstore.store import JobStore
from tuning.deployment import Deployment, flush, running_on, serving, status_events, wait_until
from workers.shutdown import HAND_BACK_WAIT_S, STRAGGLER_WAIT_S

LEASE = {"ttl_s": 2.0, "heartbeat_s": 0.4, "reaper_interval_s": 0.3, "max_attempts": 2}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    overrides = {f"MMQ_LEASE__{k.upper()}": str(v) for k, v in LEASE.items()}
    # Celery's messages are watched here, so every queued job has one: fair share's held
    # jobs (no message until released) are tested in test_fairness.py.
    overrides["MMQ_FAIRNESS__ENABLED"] = "false"
    deployment = Deployment(
        redis_url,
        tmp_path_factory.mktemp("leases"),
        env_overrides=overrides,
        config_values={"echo_max_batch": 4, "echo_max_wait_ms": 20, "echo_concurrency": 4},
    )
    with serving(deployment):
        deployment.start()
        yield deployment


@pytest.fixture
def owner(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"lease{time.monotonic_ns()}")


def test_sigkilled_worker_jobs_run_again_elsewhere_exactly_once(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    victim = dep.start_worker("echo", 0, wait=False)
    survivor = dep.start_worker("echo", 1, wait=False)
    dep.wait_started([victim, survivor])
    ids = [
        owner.submit("echo", text=f"load {i}", group=f"g{i % 3}", sleep_ms=600)["id"]
        for i in range(24)
    ]
    on_victim: list[str] = []

    def victim_running() -> bool:
        on_victim[:] = running_on(rclient, victim)
        return bool(on_victim)

    wait_until(victim_running, victim, timeout_s=20)
    victim.kill()
    killed_at = time.time()
    lost = list(on_victim)

    jobs = {job_id: owner.wait(job_id, timeout_s=60) for job_id in ids}
    assert {j["status"] for j in jobs.values()} == {"succeeded"}
    for job_id in ids:
        statuses = status_events(rclient, job_id)
        assert statuses.count("succeeded") == 1, statuses
        assert statuses[-1] == "succeeded"
        outputs = [e for _, e in rclient.xrange(keys.job_events(job_id)) if e["type"] == "output"]
        assert len(outputs) == 1
    budget_s = LEASE["ttl_s"] + LEASE["reaper_interval_s"] + LEASE["heartbeat_s"] + 1.5
    for job_id in lost:
        job = jobs[job_id]
        assert job["attempts"] == 2
        assert job["output"]["pid"] == survivor.process.pid
        requeued = [
            float(e["ts"])
            for _, e in rclient.xrange(keys.job_events(job_id))
            if e["type"] == "status" and json.loads(e["data"]).get("reason") == "worker_lost"
        ]
        assert len(requeued) == 1
        delay = requeued[0] - killed_at
        assert 0 < delay < budget_s, f"requeued {delay:.1f}s after the kill"
        assert status_events(rclient, job_id)[:4] == ["queued", "running", "queued", "running"]
    # The killed worker's own messages of those jobs are dropped once stale, not put back
    # in the queue beside the new messages the lease sweep sent.
    wait_until(lambda: rclient.hlen(UNACKED) == 0, timeout_s=4 * LEASE["ttl_s"] + 5)
    reaper = next(p for p in dep.procs if p.name == "reaper")
    assert not [j for j in lost if f"job {j}: its task message was stranded" in reaper.log()]
    survivor.stop()


def redeliver(app: Celery, job: Job) -> None:
    """Send the job's task again, as Celery redelivers one."""
    app.send_task(TASK_NAME, args=[job.id], queue=queue_name(job.pipeline))


def test_redelivered_task_for_ended_or_held_job_is_dropped(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    worker = dep.start_worker("echo", 2)
    done = owner.wait(owner.submit("echo", text="once")["id"])
    assert done["status"] == "succeeded"
    settings = load_settings(dep.config_path, redis_url=dep.redis_url)
    store = JobStore.connect(settings)
    job = store.get(done["id"])
    assert job is not None
    events_before = len(rclient.xrange(keys.job_events(job.id)))
    celery = make_celery(settings)
    redeliver(celery, job)

    held = owner.submit("echo", text="held", sleep_ms=3000, group="held")
    wait_until(lambda: owner.get(held["id"])["status"] == "running", worker)
    held_job = store.get(held["id"])
    assert held_job is not None
    redeliver(celery, held_job)

    expected = [f"job {job.id}: dropped:succeeded", f"job {held_job.id}: dropped:running"]
    wait_until(lambda: all(line in worker.log() for line in expected), worker, timeout_s=10)
    again = owner.get(job.id)
    assert again["attempts"] == 1 and again["output"] == done["output"]
    assert len(rclient.xrange(keys.job_events(job.id))) == events_before
    finished = owner.wait(held["id"])
    assert finished["status"] == "succeeded" and finished["attempts"] == 1
    worker.stop()


TAKE_AND_DIE = """
import os
from broker.celery_app import make_celery
from jobs.settings import load_settings

app = make_celery(load_settings())
with app.connection_for_read() as conn:
    message = conn.default_channel.basic_get(queue="mmq.sleep", no_ack=False)
    print("took" if message is not None else "empty", flush=True)
    os._exit(0)  # dies holding the message, before the job started
"""


def test_a_message_taken_by_a_worker_that_died_before_the_job_started_is_requeued(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    job = owner.submit("sleep", steps=1, step_ms=1)  # no sleep worker yet: it stays queued
    taker = subprocess.run(
        [sys.executable, "-c", TAKE_AND_DIE], env=dep.env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert taker.stdout.strip() == "took", taker.stderr
    assert rclient.hlen(UNACKED) >= 1 and owner.get(job["id"])["status"] == "queued"
    worker = dep.start_worker("sleep")
    ended = owner.wait(job["id"], timeout_s=30)
    assert ended["status"] == "succeeded" and ended["attempts"] == 1
    reaper = next(p for p in dep.procs if p.name == "reaper")
    assert "stranded with a dead worker" in reaper.log()
    worker.stop()


def test_the_reaper_forgets_workers_that_went_silent(dep: Deployment, rclient: redis.Redis) -> None:
    beat = LEASE["heartbeat_s"]
    rclient.zadd(keys.WORKERS, {"killed-long-ago": time.time() - 61 * beat})
    rclient.zadd(keys.WORKERS, {"missed-a-few-beats": time.time() - 10 * beat})
    wait_until(lambda: rclient.zscore(keys.WORKERS, "killed-long-ago") is None, timeout_s=10)
    assert rclient.zscore(keys.WORKERS, "missed-a-few-beats") is not None
    rclient.zrem(keys.WORKERS, "missed-a-few-beats")


def test_a_job_that_kills_every_worker_ends_failed_after_max_attempts(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    spec = ProcSpec("echo", mmq_command("worker", "--pipeline", "echo"))
    supervisor = Supervisor([spec], base_env=dep.env, backoff_s=0.2, max_backoff_s=1)
    runner = threading.Thread(target=supervisor.run, kwargs={"poll_s": 0.1}, daemon=True)
    runner.start()
    try:
        poison = owner.submit("echo", text="poison", crash=True, sleep_ms=200, group="poison")
        job = owner.wait(poison["id"], timeout_s=60)
        assert job["status"] == "failed"
        assert job["error"]["type"] == "worker_lost"
        assert "2 times" in job["error"]["message"]
        assert job["attempts"] == LEASE["max_attempts"]
        assert status_events(rclient, job["id"])[-1] == "failed"
        assert supervisor.children[0].restarts >= 2
        healthy = owner.wait(owner.submit("echo", text="after the storm")["id"], timeout_s=30)
        assert healthy["status"] == "succeeded"
    finally:
        supervisor.stop()
        runner.join(20)
    assert all(c.process is None for c in supervisor.children)


GRACE_S = 5.0
"""`worker.shutdown_grace_s` of the workers stopped with SIGTERM here."""


def _status_data(r: redis.Redis, job_id: str) -> list[dict[str, object]]:
    return [
        json.loads(e["data"]) for _, e in r.xrange(keys.job_events(job_id)) if e["type"] == "status"
    ]


def test_a_sigtermed_worker_finishes_what_it_can_hands_back_the_rest_and_exits(
    dep: Deployment, owner: Api, rclient: redis.Redis
) -> None:
    """SIGTERM (as Kubernetes sends it: to the process alone) with jobs in flight of three
    sorts: a batch that ends within the grace (succeeds there, once, attempts 1), a batch
    of a pipeline that ignores cancel and would run past it, and a step-wise job that stops
    on cancel (both queued again by the stopping worker, attempts back to 0, and run once
    on another worker, attempts 1). A job submitted after the signal never runs there.

    "Without counting an attempt": `attempts` counts the runs a job started that were not
    handed back; a handed-back job's `attempts` goes back to what it was before that run
    (0 here), and its next start makes it 1."""
    env = {"MMQ_WORKER__SHUTDOWN_GRACE_S": str(GRACE_S)}
    echo = dep.start_worker("echo", 3, env=env, wait=False)
    sleeper = dep.start_worker("sleep", 3, env=env, wait=False)
    dep.wait_started([echo, sleeper])
    quick = owner.submit("echo", text="quick", group="quick", sleep_ms=1500)["id"]
    wait_until(lambda: owner.get(quick)["status"] == "running", echo)
    # Its batch runs after the quick one's and past the grace, ignoring its cancel (echo
    # never looks): the stopping thread hands it back.
    stuck = owner.submit("echo", text="stuck", group="stuck", sleep_ms=12_000)["id"]
    steps = owner.submit("sleep", steps=90, step_ms=100)["id"]  # stops at its next step
    wait_until(lambda: owner.get(stuck)["status"] == "running", echo)
    wait_until(lambda: owner.get(steps)["status"] == "running", sleeper)

    signaled_at = time.monotonic()
    for proc in (echo, sleeper):
        os.kill(proc.process.pid, signal.SIGTERM)
    late = owner.submit("echo", text="late", group="late")["id"]  # a free slot is there
    for proc in (echo, sleeper):
        proc.process.wait(GRACE_S + HAND_BACK_WAIT_S + STRAGGLER_WAIT_S + 20)
        assert proc.process.returncode == 0, proc.log()[-3000:]
    # A liveness bound (a stuck echo thread is left behind after the straggler wait).
    assert time.monotonic() - signaled_at < GRACE_S + HAND_BACK_WAIT_S + STRAGGLER_WAIT_S + 20

    job = owner.get(quick)
    assert job["status"] == "succeeded" and job["attempts"] == 1
    assert job["output"]["pid"] == echo.process.pid
    assert status_events(rclient, quick) == ["queued", "running", "succeeded"]
    for job_id in (stuck, steps):
        job = owner.get(job_id)
        assert job["status"] == "queued" and job["attempts"] == 0, job
        assert _status_data(rclient, job_id)[-1] == {"status": "queued", "reason": "shutdown"}
    assert owner.get(late)["status"] == "queued"
    assert status_events(rclient, late) == ["queued"]
    assert "1 jobs handed back for runs that did not stop" in echo.log()
    assert f"job {steps}: handed back to the queue" in sleeper.log()
    assert f"job {late}: refused:stopping" in echo.log() or late not in echo.log()

    others = [dep.start_worker("echo", 4, wait=False), dep.start_worker("sleep", 4, wait=False)]
    dep.wait_started(others)
    for job_id, pid in ((stuck, others[0]), (late, others[0]), (steps, others[1])):
        job = owner.wait(job_id, timeout_s=90)
        assert job["status"] == "succeeded" and job["attempts"] == 1, job
        assert job["output"]["pid"] == pid.process.pid
    assert status_events(rclient, stuck) == ["queued", "running", "queued", "running", "succeeded"]
    assert status_events(rclient, steps) == ["queued", "running", "queued", "running", "succeeded"]
    assert status_events(rclient, late) == ["queued", "running", "succeeded"]
    for proc in others:
        proc.stop()
