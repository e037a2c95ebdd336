"""A device's room in Redis as the workers on it read it (`jobstore.device_room.DeviceRoom`),
against a real Redis: which sibling a cold worker leaves a job to; and a worker that exits
once it has unloaded (`exit_after_unload`), with real processes."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from harness.api_client import new_owner
from jobs import keys
from jobs.device_models import split_member
from jobstore.device_room import DeviceRoom
from tuning.deployment import flush, running


def test_a_warm_sibling_is_one_loaded_with_a_free_slot(redis_url: str) -> None:
    """A live sibling whose model is loaded and has a slot free (idle, or busy below its
    slots, as an LLM engine with room in its batch) takes the job; a full one, one still
    loading, or one whose heartbeat stopped does not."""
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    tag = f"room{time.monotonic_ns()}"
    cold_name, warm_name, pipeline = f"{tag}-cold", f"{tag}-warm", f"{tag}-p"
    cold = DeviceRoom(r, tag, "cpu", cold_name, stale_s=60)
    warm = DeviceRoom(r, tag, "cpu", warm_name, stale_s=60)
    (now_s, _) = r.time()
    r.zadd(keys.WORKERS, {cold_name: now_s, warm_name: now_s})
    try:
        assert warm.claim(pipeline, 1, 0, 0, slots=3) == ["ok"]
        assert cold.warm_sibling(pipeline) is None  # claimed, still loading
        for busy, idle_since, takes in [(0, 1.0, True), (1, 0, True), (2, 0, True), (3, 0, False)]:
            warm.mark_use(busy, idle_since)
            assert (cold.warm_sibling(pipeline) == warm_name) is takes, (busy, idle_since)
        warm.mark_use(1, 0)
        assert cold.warm_sibling(f"{tag}-other") is None
        r.zadd(keys.WORKERS, {warm_name: now_s - 120})  # its heartbeat stopped
        assert cold.warm_sibling(pipeline) is None
    finally:
        warm.free()
        r.zrem(keys.WORKERS, cold_name, warm_name)
        r.srem(keys.MODEL_DEVICES, warm.member)


NAPPER = """
[pipelines.napper]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
residency = "on_demand"
memory_gb = 0.1
min_loaded_s = 0
idle_unload_s = 1
exit_after_unload = true
"""


def test_a_worker_that_exits_after_unloading_leaves_room_and_a_fresh_one_loads_again(
    redis_url: str, tmp_path: Path
) -> None:
    """`exit_after_unload` (the default on a GPU, where a process keeps its CUDA context
    after an unload): idle, the worker unloads and exits cleanly, its room is given back,
    and the worker its supervisor starts next loads for the next job."""
    flush(redis_url)
    env = {"MMQ_LEASE__HEARTBEAT_S": "0.4", "MMQ_LEASE__TTL_S": "2"}
    with running(redis_url, tmp_path, env, ["echo", "sleep"], NAPPER) as dep:
        api = new_owner(dep.redis_url, dep.base_url, f"napper{time.monotonic_ns()}")
        first = dep.start_worker("napper")
        job = api.wait(api.submit("sleep", model="napper", steps=2, step_ms=10)["id"])
        assert job["status"] == "succeeded" and job["timings"]["load_ms"] is not None
        assert first.process.wait(timeout=30) == 0  # idle for idle_unload_s, then gone
        assert "unloaded napper" in first.log() and "this worker exits" in first.log()
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        entries = [
            raw for d in r.smembers(keys.MODEL_DEVICES)
            for raw in r.hgetall(keys.device_models(*split_member(d))).values()
        ]  # fmt: skip
        assert not any('"napper"' in raw for raw in entries)
        second = dep.start_worker("napper", instance=0)  # as its supervisor would
        again = api.wait(api.submit("sleep", model="napper", steps=2, step_ms=10)["id"])
        assert again["status"] == "succeeded" and again["timings"]["load_ms"] is not None
        assert second.alive()  # busy again: it stays (it exits after its own idle unload)
