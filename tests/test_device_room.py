"""A device's room in Redis as the workers on it read it (`workers.residency.DeviceRoom`),
against a real Redis: which sibling a cold worker leaves a job to."""

from __future__ import annotations

import time

import redis

from jobs import keys
from workers.residency import DeviceRoom


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
