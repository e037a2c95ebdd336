"""One worker process hosting two on-demand pipelines (the Piper voice and tiny.en) on a
CPU "device" whose budget fits one of them: each job runs once in that process, the two
models take turns on the device without ever being loaded together, and the process
stays up across the unloads (its other model shares what it keeps). A resident pipeline,
or pipelines of two devices, cannot share a process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from harness.audio import SHORT, spoken
from harness.client import Api, new_owner
from harness.deploy import REPO, Deployment, Proc, flush, running, wait_until
from harness.kinds import pipeline_toml
from harness.metrics import scrape, value
from jobs import keys
from jobs.settings import Settings
from workers.process import check_shared

ON_DEMAND = 'residency = "on_demand"\nmemory_gb = 1.0\nmin_loaded_s = 0\nidle_unload_s = 600\n'
ENV = {
    "MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 1.5}),  # one of the two at a time
    "MMQ_LEASE__TTL_S": "2",
    "MMQ_LEASE__HEARTBEAT_S": "0.4",
}
CONFIG = pipeline_toml("tts", {}, ON_DEMAND) + pipeline_toml("asr", {}, ON_DEMAND)


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    tmp = tmp_path_factory.mktemp("shared")
    # echo and sleep (the test config's) for /readyz; tts and asr in one process below
    with running(redis_url, tmp, ENV, ["echo", "sleep"], CONFIG) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def shared(dep: Deployment) -> Proc:
    proc = dep.spawn("worker-tts+asr", "worker", "--pipeline", "tts", "--pipeline", "asr")
    wait_until(lambda: "ready." in proc.log(), proc, timeout_s=60)
    return proc


def _on_demand_loaded(r: redis.Redis) -> list[str]:
    """The on-demand pipelines counted on this host's CPU now."""
    (device,) = [d for d in r.smembers(keys.MODEL_DEVICES) if d.endswith("|cpu")]
    host, _, name = device.partition("|")
    entries = [json.loads(raw) for raw in r.hgetall(keys.device_models(host, name)).values()]
    return sorted(e["pipeline"] for e in entries if not e["resident"] and e.get("loaded_at"))


def test_two_on_demand_pipelines_take_turns_in_one_process(dep: Deployment, shared: Proc) -> None:
    api = new_owner(dep.redis_url, dep.base_url, f"shared{time.monotonic_ns()}")
    r = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    up = api.http.post("/v1/files", files={"file": ("s.wav", spoken(SHORT[:1]), "audio/wav")})
    assert up.status_code == 201, up.text
    most: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # bounded by the test: stopped in `finally`
        while not stop.wait(0.02):
            most.append(len(_on_demand_loaded(r)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        ends = []
        for i in range(3):
            ends.append(_run(api, "tts", text=f"Reading number {i}.", format="wav"))
            ends.append(_run(api, "asr", audio=up.json()["key"]))
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert [j["status"] for j in ends] == ["succeeded"] * 6, ends
    assert all(j["attempts"] == 1 for j in ends)
    # Both pipelines ran as workers of the one process: the pid ends their names.
    pids = {j["worker"].rsplit(".", 1)[1] for j in ends}
    assert pids == {str(shared.process.pid)}, [j["worker"] for j in ends]
    assert {j["worker"].split("-", 1)[0] for j in ends} == {"tts", "asr"}
    # Each switch loaded the other model, and the device never held both.
    assert all(j["timings"]["load_ms"] is not None for j in ends), [j["timings"] for j in ends]
    assert max(most, default=0) == 1, most  # one loaded at a time, never two
    wait_until(lambda: _loads(dep) >= 6, timeout_s=10)  # the tally writes every second
    assert shared.alive()


def test_a_resident_pipeline_or_two_devices_do_not_share_a_process(dep: Deployment) -> None:
    def settings(**devices: str) -> Settings:
        tables = {
            name: {"kind": "sleep", "impl": "harness.pipelines:SleepPipeline", "device": device,
                   "residency": "on_demand" if name != "kept" else "resident"}
            for name, device in devices.items()
        }  # fmt: skip
        return Settings(pipelines=tables)

    assert check_shared(settings(a="cpu", b="cpu"), ["a", "b"]) is None
    assert check_shared(settings(a="cpu", kept="cpu"), ["a"]) is None
    assert "resident: kept" in str(check_shared(settings(a="cpu", kept="cpu"), ["a", "kept"]))
    assert "one device" in str(check_shared(settings(a="cpu", b="gpu:0"), ["a", "b"]))
    assert "named twice" in str(check_shared(settings(a="cpu"), ["a", "a"]))
    # The command refuses them before it starts anything.
    done = subprocess.run(
        [sys.executable, "-m", "mmq.cli", "worker", "--pipeline", "tts", "--pipeline", "echo"],
        env=dep.env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "only on-demand pipelines share a process; resident: echo" in done.stderr


def _run(api: Api, kind: str, **inp: Any) -> dict[str, Any]:
    return api.wait(api.submit(kind, **inp)["id"], timeout_s=120)


def _loads(dep: Deployment) -> float:
    samples = scrape(dep)
    return sum(value(samples, "mmq_model_loads_total", pipeline=p) for p in ("tts", "asr"))
