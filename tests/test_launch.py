"""`mmq workers --placement` with real CPU worker processes: one process per (device,
pipeline, instance), pinned with CUDA_VISIBLE_DEVICES; jobs spread over the instances of
an unbatchable pipeline; a placement knob reaches its workers; a killed worker comes back
after its backoff; Ctrl-C stops them all."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import redis

from harness.api_client import Api, new_owner
from jobs import keys
from tuning.deployment import Deployment, Proc, flush, serving, wait_until

HEARTBEAT_S = 0.5
READY = " ready."
"""Celery's line in a worker's log (the launcher's, which its children share) once it
takes jobs."""
PLACEMENT = """
[[place]]
pipeline = "sleep"
device = "cpu"
instances = 3

[[place]]
pipeline = "echo"
device = "auto"
max_batch = 2
"""


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = Deployment(
        redis_url,
        tmp_path_factory.mktemp("launch"),
        env_overrides={"MMQ_LEASE__HEARTBEAT_S": str(HEARTBEAT_S)},
        config_values={"echo_max_wait_ms": 200},
    )
    with serving(dep):
        dep.start_api()
        yield dep


def live_workers(client: redis.Redis) -> dict[str, dict[str, str]]:
    """Workers whose heartbeat is recent, by name: their kind, pipeline, device, pid."""
    names = client.zrangebyscore(keys.WORKERS, time.time() - 3 * HEARTBEAT_S, "+inf")
    found = {name: client.hgetall(keys.worker(name)) for name in names}
    return {name: info for name, info in found.items() if info}


def pids_of(client: redis.Redis, pipeline: str) -> set[int]:
    return {int(w["pid"]) for w in live_workers(client).values() if w["pipeline"] == pipeline}


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def test_workers_follow_the_placement_and_restart_and_stop(
    dep: Deployment, rclient: redis.Redis
) -> None:
    placement = dep.tmp / "placement.toml"
    placement.write_text(PLACEMENT)
    # This "host" shares the API's disk: its local storage is shared.
    launcher = dep.spawn(
        "workers", "workers", "--placement", str(placement),
        env={"MMQ_STORAGE__LOCAL_SHARED": "true"},
    )  # fmt: skip
    wait_until(lambda: len(live_workers(rclient)) == 4, launcher, timeout_s=60)
    # A worker is listed from its first heartbeat, a moment before it takes jobs.
    wait_until(lambda: launcher.log().count(READY) == 4, launcher, timeout_s=60)
    assert {w["device"] for w in live_workers(rclient).values()} == {"cpu"}
    sleepers = pids_of(rclient, "sleep")
    assert len(sleepers) == 3
    for pid in sleepers:
        assert environ(pid)["CUDA_VISIBLE_DEVICES"] == ""
        assert b"--device\0cpu" in Path(f"/proc/{pid}/cmdline").read_bytes()
    owner = new_owner(dep.redis_url, dep.base_url, "launch")

    _spread_over_the_instances(owner, sleepers)
    _knobs_reach_the_workers(owner)
    _a_killed_worker_comes_back(rclient, launcher, sleepers)
    _spread_over_the_instances(owner, pids_of(rclient, "sleep"))  # the new one takes jobs

    every = sleepers | pids_of(rclient, "sleep") | pids_of(rclient, "echo")
    launcher.process.send_signal(signal.SIGINT)
    assert launcher.process.wait(30) == 0
    wait_until(lambda: not any(_alive(pid) for pid in every), timeout_s=15)
    assert live_workers(rclient) == {}  # each stopped worker took itself off the list
    assert "stopped" in launcher.log()


def _spread_over_the_instances(owner: Api, sleepers: set[int]) -> None:
    def run(_: int) -> dict[str, object]:
        job = owner.submit("sleep", steps=8, step_ms=100)
        return owner.wait(job["id"])

    with ThreadPoolExecutor(3) as pool:
        jobs = list(pool.map(run, range(3)))
    assert all(job["status"] == "succeeded" for job in jobs), jobs
    assert {job["output"]["pid"] for job in jobs} == sleepers  # type: ignore[index]
    started = max(datetime.fromisoformat(str(job["started_at"])) for job in jobs)
    finished = min(datetime.fromisoformat(str(job["finished_at"])) for job in jobs)
    assert started < finished  # all three ran at once


def _knobs_reach_the_workers(owner: Api) -> None:
    def run(i: int) -> dict[str, object]:
        job = owner.submit("echo", text=f"e{i}", group="knob", sleep_ms=300)
        return owner.wait(job["id"])

    with ThreadPoolExecutor(4) as pool:
        jobs = list(pool.map(run, range(4)))
    sizes = [job["output"]["batch_size"] for job in jobs]  # type: ignore[index]
    assert max(sizes) == 2  # the placement's max_batch, not the config's 8


def _a_killed_worker_comes_back(client: redis.Redis, launcher: Proc, before: set[int]) -> None:
    victim = min(before)
    ready = launcher.log().count(READY)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: len(pids_of(client, "sleep") - before) == 1, launcher, timeout_s=30)
    assert len(pids_of(client, "sleep")) == 3
    assert "on cpu exited with -9; restarting in 1.0s" in launcher.log()
    wait_until(lambda: launcher.log().count(READY) == ready + 1, launcher, timeout_s=30)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
