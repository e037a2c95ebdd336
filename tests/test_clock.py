"""Leases, the reaper and liveness run on Redis's clock, never a worker host's.

A worker whose clock is a minute off (libfaketime preloaded into its process: its
`time.time()` says so, its monotonic clock is left alone) keeps its jobs as long as it
renews them, counts as live in `/readyz`, and when it dies its job is reaped within a
lease, as for any other worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import libfaketime
import pytest
import redis

from harness.api_client import new_owner
from jobs import keys
from jobstore.codec import time_seconds
from tuning.deployment import Deployment, Proc, flush, serving, status_events, wait_until

TTL_S = 2.0
SKEW_S = 60


def skewed(offset_s: int) -> dict[str, str]:
    """The environment that moves a process's wall clock by `offset_s` (libfaketime)."""
    _, env = libfaketime.get_reload_information()
    return {**env, "FAKETIME": f"{offset_s:+d}s"}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = Deployment(
        redis_url,
        tmp_path_factory.mktemp("clock"),
        env_overrides={
            "MMQ_LEASE__TTL_S": str(TTL_S),
            "MMQ_LEASE__HEARTBEAT_S": "0.3",
            "MMQ_LEASE__REAPER_INTERVAL_S": "0.2",
        },
    )
    with serving(dep):
        dep.start(["echo"])  # /readyz then waits for a live sleep worker alone
        yield dep


def _ready(dep: Deployment) -> bool:
    return httpx.get(f"{dep.base_url}/readyz", timeout=5).status_code == 200


def _skewed_worker(dep: Deployment, offset_s: int) -> Proc:
    worker = dep.start_worker("sleep", env=skewed(offset_s))
    wait_until(lambda: _ready(dep))  # its heartbeat is in Redis's time: live
    return worker


def test_a_worker_a_minute_behind_keeps_its_renewed_job_and_counts_as_live(
    dep: Deployment, rclient: redis.Redis
) -> None:
    """Deadlines and heartbeats by its clock would be a minute in the past: its job
    reaped at once (were it not for the lease key) and the worker taken for dead."""
    worker = _skewed_worker(dep, -SKEW_S)
    try:
        api = new_owner(dep.redis_url, dep.base_url, "clockbehind")
        # Runs for 2.5 leases: it must be renewed, never reaped.
        job = api.submit("sleep", steps=25, step_ms=int(TTL_S * 100))
        wait_until(lambda: api.get(job["id"])["status"] == "running")
        deadline = rclient.zscore(keys.RUNNING, job["id"])
        now = time_seconds(rclient.time())
        assert deadline is not None and now < deadline <= now + TTL_S + 0.5
        assert _ready(dep)  # its heartbeat is in Redis's time: live, not a minute off
        done = api.wait(job["id"], timeout_s=30)
        assert done["status"] == "succeeded" and done["attempts"] == 1, done
        assert status_events(rclient, job["id"]) == ["queued", "running", "succeeded"]
    finally:
        worker.stop()


def test_a_dead_worker_a_minute_ahead_has_its_job_reaped_within_a_lease(
    dep: Deployment, rclient: redis.Redis
) -> None:
    """Its clock a minute ahead: deadlines by its clock would keep its job a minute."""
    worker = _skewed_worker(dep, SKEW_S)
    api = new_owner(dep.redis_url, dep.base_url, "clockdead")
    job = api.submit("sleep", steps=30, step_ms=100)
    wait_until(lambda: api.get(job["id"])["status"] == "running")
    worker.kill()
    killed_at = time.monotonic()
    wait_until(lambda: api.get(job["id"])["status"] == "queued", timeout_s=SKEW_S / 2)
    reaped_s = time.monotonic() - killed_at
    assert reaped_s < TTL_S + 2, reaped_s
    rescuer = dep.start_worker("sleep")
    try:
        done = api.wait(job["id"], timeout_s=30)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
    finally:
        rescuer.stop()
