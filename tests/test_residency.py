"""Models loaded on demand, against real processes and real models (the Piper voice and
tiny.en) on a CPU "device" whose budget fits one of them: a model loads for its first
job and once per burst, unloads when idle, makes room for the other model only when it
has no work, is never unloaded under a running job, and a worker SIGKILLed while it
loads loses no job."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
import redis

from harness.api_client import Api, new_owner
from harness.audio import SHORT, spoken
from harness.kinds import pipeline_toml
from harness.scrape import scrape, value
from jobs import keys
from tuning.deployment import Deployment, flush, running, wait_until

IDLE_UNLOAD_S = 2.0
ON_DEMAND = 'residency = "on_demand"\nmemory_gb = 1.0\nmin_loaded_s = 0\nidle_unload_s = {idle}\n'
"""Both models on demand, 1 GiB each; TTS unloads after IDLE_UNLOAD_S, ASR not in a test."""
ENV = {
    "HF_HUB_OFFLINE": "1",
    "MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 1.5}),  # one of the two at a time
    "MMQ_LEASE__TTL_S": "2",
    "MMQ_LEASE__HEARTBEAT_S": "0.4",
    "MMQ_LEASE__REAPER_INTERVAL_S": "0.3",
}


DOZY = """
[pipelines.dozy]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
residency = "on_demand"
memory_gb = 0.1
min_loaded_s = 0
idle_unload_s = 600
max_batch = 1
runners = 3
concurrency = 3
"""
"""A model with three slots (as an LLM engine has `max_inflight`), small enough to sit
beside either of the others."""


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    config = pipeline_toml("tts", {}, ON_DEMAND.format(idle=IDLE_UNLOAD_S))
    config += pipeline_toml("asr", {}, ON_DEMAND.format(idle=600)) + DOZY
    workers = ["tts", "asr", "echo", "sleep"]  # echo and sleep: the test config's, for /readyz
    tmp = tmp_path_factory.mktemp("residency")
    with running(redis_url, tmp, ENV, workers, config) as deployment:
        yield deployment


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"res{time.monotonic_ns()}")


@pytest.fixture
def r(dep: Deployment) -> redis.Redis:
    return redis.Redis.from_url(dep.redis_url, decode_responses=True)


@pytest.fixture(scope="module")
def speech_file() -> bytes:
    return spoken(SHORT[:1])


def _loaded(r: redis.Redis) -> list[str]:
    """The on-demand pipelines counted on this host's CPU now (the echo and sleep
    workers' are resident)."""
    entries = [json.loads(raw) for raw in r.hgetall(_models_key(r)).values()]
    return sorted(e["pipeline"] for e in entries if not e["resident"])


def _models_key(r: redis.Redis) -> str:
    (device,) = [d for d in r.smembers(keys.MODEL_DEVICES) if d.endswith("|cpu")]
    host, _, name = device.partition("|")
    return keys.device_models(host, name)


def _speak(api: Api, text: str = "Hello there.") -> dict[str, Any]:
    return api.wait(api.submit("tts", text=text, format="wav")["id"], timeout_s=120)


def _transcribe(api: Api, audio: bytes) -> dict[str, Any]:
    up = api.http.post("/v1/files", files={"file": ("s.wav", audio, "audio/wav")})
    assert up.status_code == 201, up.text
    return api.wait(api.submit("asr", audio=up.json()["key"])["id"], timeout_s=120)


def _loads(dep: Deployment, pipeline: str) -> float:
    return value(scrape(dep), "mmq_model_loads_total", pipeline=pipeline)


def _loads_come_to(dep: Deployment, pipeline: str, n: float) -> float:
    """The loads counted, once the worker's tally (written every second) has `n`."""
    wait_until(lambda: _loads(dep, pipeline) >= n, timeout_s=10)
    return _loads(dep, pipeline)


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_a_model_loads_for_its_first_job_and_unloads_when_idle(
    dep: Deployment, api: Api, r: redis.Redis
) -> None:
    ready = httpx.get(f"{dep.base_url}/readyz").json()
    assert ready["status"] == "ready" and set(ready["cold"]) == {"tts", "asr", "dozy"}, ready
    loads = _loads(dep, "tts")
    first = _speak(api)
    assert first["status"] == "succeeded", first
    assert first["timings"]["load_ms"] > 0
    statuses = [
        json.loads(e["data"]) for _, e in r.xrange(keys.job_events(first["id"]))
        if e["type"] == "status"
    ]  # fmt: skip
    assert {"status": "running", "loading": "tts"} in statuses
    # A burst while it is warm: no load, no load_ms.
    warm = [api.submit("tts", text=f"Number {i}.", format="wav")["id"] for i in range(3)]
    for job_id in warm:
        job = api.wait(job_id, timeout_s=60)
        assert job["status"] == "succeeded" and job["timings"]["load_ms"] is None
    assert _loads_come_to(dep, "tts", loads + 1) == loads + 1
    assert _loaded(r) == ["tts"]
    assert httpx.get(f"{dep.base_url}/readyz").json()["cold"] == ["asr", "dozy"]
    metrics = scrape(dep)
    assert value(metrics, "mmq_models_loaded", pipeline="tts") == 1
    # Idle for idle_unload_s: unloaded, cold again, and loaded again by the next job.
    wait_until(lambda: _loaded(r) == [], timeout_s=IDLE_UNLOAD_S * 5)
    wait_until(
        lambda: value(scrape(dep), "mmq_model_unloads_total", pipeline="tts", reason="idle") >= 1
    )
    assert "tts" in httpx.get(f"{dep.base_url}/readyz").json()["cold"]
    again = _speak(api)
    assert again["status"] == "succeeded" and again["timings"]["load_ms"] > 0
    assert _loads_come_to(dep, "tts", loads + 2) == loads + 2


def test_two_models_take_turns_on_a_device_that_fits_one(
    dep: Deployment, api: Api, r: redis.Redis, speech_file: bytes
) -> None:
    wait_until(lambda: _loaded(r) == [], timeout_s=IDLE_UNLOAD_S * 5)  # both cold
    seen: list[list[str]] = []
    stop = threading.Event()

    def watch() -> None:  # what the device holds, all along
        while not stop.wait(0.05):
            seen.append(_loaded(r))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        before = {p: _loads(dep, p) for p in ("tts", "asr")}
        ends = [
            _speak(api),
            _transcribe(api, speech_file),
            _speak(api),
            _transcribe(api, speech_file),
        ]
    finally:
        stop.set()
        watcher.join()
    assert [j["status"] for j in ends] == ["succeeded"] * 4, ends
    assert "quick brown fox" in ends[1]["output"]["text"].lower()
    assert all(j["attempts"] == 1 for j in ends)
    assert all(j["timings"]["load_ms"] > 0 for j in ends)  # each found the other loaded
    loads = {p: _loads_come_to(dep, p, before[p] + 2) - before[p] for p in ("tts", "asr")}
    assert loads == {"tts": 2, "asr": 2}
    assert seen and all(len(held) <= 1 for held in seen), [s for s in seen if len(s) > 1]
    assert ["asr"] in seen and ["tts"] in seen


def test_a_model_is_not_unloaded_under_its_running_job(
    dep: Deployment, api: Api, r: redis.Redis, speech_file: bytes
) -> None:
    _speak(api)  # TTS loaded
    long_text = " ".join(f"This is sentence number {i} of a long reading." for i in range(30))
    speaking = api.submit("tts", text=long_text, format="wav")["id"]
    wait_until(lambda: api.get(speaking)["status"] == "running", timeout_s=30)
    up = api.http.post("/v1/files", files={"file": ("s.wav", speech_file, "audio/wav")})
    hearing = api.submit("asr", audio=up.json()["key"])["id"]
    spoke = api.wait(speaking, timeout_s=120)
    heard = api.wait(hearing, timeout_s=120)
    assert spoke["status"] == "succeeded" and heard["status"] == "succeeded"
    # ASR waited for the room until the TTS job was done.
    first_segment = _ts(heard["created_at"]) + heard["timings"]["time_to_first_output_ms"] / 1000
    assert first_segment > _ts(spoke["finished_at"])
    assert heard["timings"]["load_ms"] > 0


def test_a_worker_killed_while_it_loads_loses_no_job(
    dep: Deployment, api: Api, r: redis.Redis, speech_file: bytes
) -> None:
    _speak(api)  # TTS holds the room: ASR must make room, then load
    (worker,) = [p for p in dep.procs if p.name.startswith("worker-asr") and p.alive()]
    up = api.http.post("/v1/files", files={"file": ("s.wav", speech_file, "audio/wav")})
    job_id = api.submit("asr", audio=up.json()["key"])["id"]

    def loading() -> bool:
        events = r.xrange(keys.job_events(job_id))
        return any('"loading"' in e["data"] for _, e in events if e["type"] == "status")

    wait_until(loading, timeout_s=30)
    worker.kill()
    dep.procs.remove(worker)
    dep.start_worker("asr")
    job = api.wait(job_id, timeout_s=120)
    assert job["status"] == "succeeded" and job["attempts"] == 2, job
    assert "quick brown fox" in job["output"]["text"].lower()


def test_under_alternating_load_the_models_take_turns_by_bursts(
    dep: Deployment, api: Api, r: redis.Redis, speech_file: bytes
) -> None:
    """Jobs of both kinds at once, interleaved: the model in the way is drained (its new
    jobs held) so the other loads, and each load serves a burst, not one job."""
    before = {p: _loads(dep, p) for p in ("tts", "asr")}
    up = api.http.post("/v1/files", files={"file": ("s.wav", speech_file, "audio/wav")})
    ids = []
    for i in range(6):
        ids.append(api.submit("tts", text=f"Reading number {i}.", format="wav")["id"])
        ids.append(api.submit("asr", audio=up.json()["key"])["id"])
    ends = [api.wait(job_id, timeout_s=180) for job_id in ids]
    assert [j["status"] for j in ends] == ["succeeded"] * len(ids), ends
    assert all(j["attempts"] == 1 for j in ends)
    wait_until(lambda: not any(r.hgetall(k) for k in r.keys("mmq:waiting:*")), timeout_s=10)
    time.sleep(1.5)  # the tally's last write
    loads = sum(_loads(dep, p) - before[p] for p in ("tts", "asr"))
    assert 1 <= loads <= len(ids) / 2, loads  # bursts, not a load per job


def test_the_model_of_a_worker_the_reaper_forgot_is_dropped(
    dep: Deployment, r: redis.Redis
) -> None:
    """A worker killed long ago (no heartbeat left) holds no room for good."""
    key = _models_key(r)
    entry = {"pipeline": "tts", "bytes": 10**9, "resident": True, "loaded_at": 0, "idle_since": 0}
    r.hset(key, "tts-9@gone.1", json.dumps(entry))
    wait_until(lambda: not r.hexists(key, "tts-9@gone.1"), timeout_s=10)


def test_a_cold_worker_leaves_a_job_to_the_worker_whose_model_is_warm(
    dep: Deployment, api: Api, r: redis.Redis
) -> None:
    """Two TTS workers: once one has the model loaded and idle, the other gives every job
    back to it rather than take the device's room for a second copy."""
    second = dep.start_worker("tts", instance=1)
    try:
        first = _speak(api)  # one of the two has it loaded
        assert first["status"] == "succeeded"
        time.sleep(1.5)  # the tally's last write
        loads = _loads(dep, "tts")
        ends = [_speak(api, f"Sentence {i}.") for i in range(4)]
        assert all(j["status"] == "succeeded" and j["attempts"] == 1 for j in ends)
        assert {j["worker"] for j in ends} == {first["worker"]}, [j["worker"] for j in ends]
        assert all(j["timings"]["load_ms"] is None for j in ends)
        time.sleep(1.5)  # the tally's last write
        assert _loads(dep, "tts") == loads
    finally:
        second.stop()
        dep.procs.remove(second)


def test_a_job_goes_to_a_warm_worker_with_a_free_slot_and_spills_over_when_it_is_full(
    dep: Deployment, api: Api
) -> None:
    """Two workers of a three-slot pipeline: once one has the model loaded, jobs that fit
    its free slots go to it even while it is busy (no second copy is loaded for them);
    a burst beyond its slots makes the other load."""
    first_worker = dep.start_worker("dozy", instance=0, wait=False)
    second_worker = dep.start_worker("dozy", instance=1, wait=False)
    dep.wait_started([first_worker, second_worker])
    try:
        warm = api.wait(api.submit("sleep", model="dozy", steps=1, step_ms=10)["id"])
        assert warm["status"] == "succeeded" and warm["timings"]["load_ms"] is not None
        loads = _loads_come_to(dep, "dozy", 1)

        def run(n: int) -> list[dict[str, Any]]:
            ids = [api.submit("sleep", model="dozy", steps=15, step_ms=100)["id"] for _ in range(n)]
            return [api.wait(job_id, timeout_s=60) for job_id in ids]

        # The warm worker is busy with one job and has two free slots: the next two go to
        # it, one at a time (the cold worker, waiting on the queue longest, takes each
        # message first and gives it back).
        busy = api.submit("sleep", model="dozy", steps=20, step_ms=100)["id"]
        wait_until(lambda: api.get(busy)["status"] == "running", timeout_s=10)
        more = []
        for _ in range(2):
            more.append(api.submit("sleep", model="dozy", steps=10, step_ms=100)["id"])
            wait_until(lambda: api.get(more[-1])["status"] == "running", timeout_s=10)
        fits = [api.wait(job_id, timeout_s=60) for job_id in [busy, *more]]
        assert all(j["status"] == "succeeded" for j in fits)
        assert {j["worker"] for j in fits} == {warm["worker"]}, [j["worker"] for j in fits]
        time.sleep(1.5)  # the tally's last write
        assert _loads(dep, "dozy") == loads

        spills = run(6)
        assert all(j["status"] == "succeeded" and j["attempts"] == 1 for j in spills)
        assert len({j["worker"] for j in spills}) == 2
        assert _loads_come_to(dep, "dozy", loads + 1) == loads + 1
    finally:
        for worker in (first_worker, second_worker):
            worker.stop()
            dep.procs.remove(worker)
