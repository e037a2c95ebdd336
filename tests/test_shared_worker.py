"""One worker process hosting the four built-in kinds on demand (tiny.en, the Piper voice,
a tiny SD, a tiny LLM on the transformers engine) on a CPU "device" whose budget fits two
of them: under alternating traffic each job runs once in that process, the least recently
used idle model makes room, never more than two models are loaded, and the process stays
up across the unloads (its other models share what it keeps). A resident pipeline, or
pipelines of two devices, cannot share a process."""

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

from harness.api_client import new_owner
from harness.audio import SHORT, spoken
from harness.kinds import KIND_NAMES, pipeline_toml
from harness.models.llm import cached_tiny_llm
from harness.models.sd import cached_tiny_sd
from harness.scrape import scrape, value
from jobs import keys
from jobs.settings import Settings
from tuning.deployment import (
    REPO,
    START_TIMEOUT_S,
    Deployment,
    Proc,
    flush,
    private_deployment,
    running,
    wait_until,
)
from workers.process import check_shared

ON_DEMAND = 'residency = "on_demand"\nshare_process = true\nmin_loaded_s = 0\nidle_unload_s = 600\n'
MEMORY_GB = {"tts": 1.5, "asr": 1.5, "image": 1.5, "llm": 2.0}
"""The LLM's engine is sized in its `memory_gb` past a 1 GiB margin."""
MIXED_JOBS = 80
ENV = {
    "MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 3.5}),  # two of the four at a time
    "MMQ_LEASE__TTL_S": "2",
    "MMQ_LEASE__HEARTBEAT_S": "0.4",
}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    models = {"llm": cached_tiny_llm(tmp_path_factory), "sd": cached_tiny_sd(tmp_path_factory)}
    config = "".join(
        pipeline_toml(kind, models, ON_DEMAND + f"memory_gb = {MEMORY_GB[kind]}\n")
        for kind in KIND_NAMES
    )
    tmp = tmp_path_factory.mktemp("shared")
    # echo and sleep (the test config's) for /readyz, and the four kinds in one process
    # (`shared`), all started at once
    workers = ["echo", "sleep", "+".join(KIND_NAMES)]
    bound = 2 * START_TIMEOUT_S  # four kinds import beside the API's start: a bound
    with running(redis_url, tmp, ENV, workers, config, worker_timeout_s=bound) as deployment:
        yield deployment


@pytest.fixture(scope="module")
def shared(dep: Deployment) -> Proc:
    """The one worker process of the four on-demand kinds (started with `dep`)."""
    (proc,) = [p for p in dep.procs if p.name.startswith(f"worker-{'+'.join(KIND_NAMES)}-")]
    return proc


def _on_demand_loaded(r: redis.Redis) -> list[str]:
    """The on-demand pipelines counted on this host's CPU now (loaded or loading)."""
    (device,) = [d for d in r.smembers(keys.MODEL_DEVICES) if d.endswith("|cpu")]
    host, _, name = device.partition("|")
    entries = [json.loads(raw) for raw in r.hgetall(keys.device_models(host, name)).values()]
    return sorted(e["pipeline"] for e in entries if not e["resident"])


def test_four_on_demand_pipelines_take_turns_in_one_process(dep: Deployment, shared: Proc) -> None:
    api = new_owner(dep.redis_url, dep.base_url, f"shared{time.monotonic_ns()}")
    r = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    up = api.http.post("/v1/files", files={"file": ("s.wav", spoken(SHORT[:1]), "audio/wav")})
    assert up.status_code == 201, up.text
    inputs: dict[str, dict[str, Any]] = {
        "tts": {"text": "Hello there.", "format": "wav"},
        "asr": {"audio": up.json()["key"]},
        "image": {"prompt": "a red square", "width": 64, "height": 64, "steps": 2},
        "llm": {"prompt": "Count:", "max_tokens": 4},
    }
    most: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # bounded by the test: stopped in `finally`
        while not stop.wait(0.02):
            most.append(len(_on_demand_loaded(r)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    order = ["tts", "asr", "image", "llm"] * 2
    try:
        ends = [api.wait(api.submit(kind, **inputs[kind])["id"], timeout_s=240) for kind in order]
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert [j["status"] for j in ends] == ["succeeded"] * len(order), ends
    assert all(j["attempts"] == 1 for j in ends)
    # Every pipeline ran as a worker of the one process: the pid ends their names.
    assert {j["worker"].rsplit(".", 1)[1] for j in ends} == {str(shared.process.pid)}
    assert [j["worker"].split("-", 1)[0] for j in ends] == order
    # Two fit: each job's model was evicted by the two jobs since its last one, so each
    # job waited for a load, and the device never held more than two.
    assert all(j["timings"]["load_ms"] is not None for j in ends), [j["timings"] for j in ends]
    assert max(most, default=0) == 2, most
    wait_until(lambda: _loads(dep) >= len(order), timeout_s=10)  # the tally writes each second
    assert shared.alive()


def test_alternating_traffic_never_leaves_a_model_waiting_on_threads_held_for_it() -> None:
    """TTS and ASR share a process (a pool of their four slots each) on a device that fits
    one, under alternating traffic (as `bench.residency`'s mixed load). Each pipeline runs
    at most its own slots of the pool, so the loaded model's queued jobs always find a
    thread, end, and it yields its room. Without that cap, jobs of the other model waiting
    for room held every thread, and the loaded model, its own jobs queued, never yielded:
    a deadlock until the 600 s room timeout."""
    config = "".join(pipeline_toml(k, {}, ON_DEMAND + "memory_gb = 1.0\n") for k in ("tts", "asr"))
    env = {**ENV, "MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 1.5}), "HF_HUB_OFFLINE": "1"}
    with private_deployment(config, env, [], prefix="mmq-shared-mixed-") as dep:
        proc = dep.start_worker(["tts", "asr"], timeout_s=60)
        api = new_owner(dep.redis_url, dep.base_url, "mixed")
        up = api.http.post("/v1/files", files={"file": ("s.wav", spoken(SHORT[:1]), "audio/wav")})
        inputs = {
            "tts": {"text": "Number one.", "format": "wav"},
            "asr": {"audio": up.json()["key"]},
        }
        ids = []
        for i in range(MIXED_JOBS):  # 4 a second, alternating
            kind = ("tts", "asr")[i % 2]
            ids.append(api.submit(kind, **inputs[kind])["id"])
            time.sleep(0.25)
        ends = [api.wait(job_id, timeout_s=120) for job_id in ids]
        assert [j["status"] for j in ends] == ["succeeded"] * len(ids), ends
        assert all(j["attempts"] == 1 for j in ends)
        assert proc.alive()


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


def _loads(dep: Deployment) -> float:
    samples = scrape(dep)
    return sum(value(samples, "mmq_model_loads_total", pipeline=p) for p in KIND_NAMES)
