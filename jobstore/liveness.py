"""Which workers live, in Redis: each worker's heartbeat (`keys.WORKERS`, scored by Redis's
clock) and what it says of itself (`keys.worker`: pipeline, device, slots, what it runs
now), its start of its pipeline (`keys.pipeline_state`: loading, ready or failed, which
`/readyz` reads), the cancel notices workers listen to, and the reaper's forgetting of
long-silent ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from jobs import keys
from jobstore.codec import flat_pairs, text_list, text_map


class LivenessStore:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def beat(self, worker: str, now: float, info: Mapping[str, str], ttl_s: int) -> None:
        """The worker lives at `now` (Redis's clock); its self-description is kept `ttl_s`."""
        pipe = self.r.pipeline()
        pipe.zadd(keys.WORKERS, {worker: now})
        pipe.hset(keys.worker(worker), items=flat_pairs(dict(info)))
        pipe.expire(keys.worker(worker), ttl_s)
        pipe.execute()

    def leave(self, worker: str) -> None:
        """A worker that stops: no longer live, at once."""
        pipe = self.r.pipeline()
        pipe.zrem(keys.WORKERS, worker)
        pipe.delete(keys.worker(worker))
        pipe.execute()

    def forget_silent(self, since: float) -> int:
        """Drop the heartbeats older than `since`; how many."""
        return int(self.r.zremrangebyscore(keys.WORKERS, "-inf", since))

    def cancel_notices(self) -> Any:
        """A pub/sub subscribed to the cancel notices (job ids whose stop was asked)."""
        pubsub = self.r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        pubsub.subscribe(keys.CANCEL_CHANNEL)
        return pubsub

    def record_start(
        self, pipeline: str, fields: Mapping[str, str], ttl_s: int, drop: str = ""
    ) -> None:
        """A worker's start of `pipeline` (loading, ready, failed), kept `ttl_s`."""
        key = keys.pipeline_state(pipeline)
        pipe = self.r.pipeline()
        pipe.hset(key, items=flat_pairs(dict(fields)))
        if drop:
            pipe.hdel(key, drop)
        pipe.expire(key, ttl_s)
        pipe.execute()

    def start_of(self, pipeline: str) -> dict[str, str]:
        """The last start of `pipeline` recorded (state, worker, pid, reason, at); empty
        where none is."""
        return text_map(self.r.hgetall(keys.pipeline_state(pipeline)))

    def worker_names(self) -> list[str]:
        """Every worker with a heartbeat kept (live or not yet forgotten)."""
        return text_list(self.r.zrange(keys.WORKERS, 0, -1))

    def keep_start(self, pipeline: str, ttl_s: int) -> None:
        """A start still loading: its record kept `ttl_s` more."""
        self.r.expire(keys.pipeline_state(pipeline), ttl_s)
