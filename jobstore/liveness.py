"""Which workers live, in Redis: each worker's heartbeat (`keys.WORKERS`, scored by Redis's
clock) and what it says of itself (`keys.worker`: pipeline, device, slots, what it runs
now), its start of its pipeline (`keys.pipeline_state`: loading, ready or failed, which
`/readyz` reads), the cancel notices workers listen to, and the reaper's forgetting of
long-silent ones. `LivenessStore` is the workers', the reaper's and `mmq up`'s;
`AsyncLiveness` what `/readyz` reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis
import redis.asyncio as aredis
from redis.client import PubSub

from jobs import keys
from jobstore.codec import flat_pairs, text_list, text_map, time_seconds


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

    def cancel_notices(self) -> PubSub:
        """A pub/sub subscribed to the cancel notices (job ids whose stop was asked)."""
        pubsub: PubSub = self.r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
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


class AsyncLiveness:
    def __init__(self, client: aredis.Redis) -> None:
        self.r = client

    async def ping(self) -> None:
        """Returns once Redis answers (raises its error where it does not)."""
        await self.r.ping()

    async def live_workers(self, stale_s: float) -> list[str]:
        """The workers whose last heartbeat is at most `stale_s` old (Redis's clock)."""
        now = time_seconds(await self.r.time())
        return text_list(await self.r.zrangebyscore(keys.WORKERS, now - stale_s, "+inf"))

    async def kinds_of(self, workers: Sequence[str]) -> set[str]:
        """The kinds that `workers` serve (as they say of themselves)."""
        return {kind for kind, _ in await self.served_by(workers)}

    async def served_by(self, workers: Sequence[str]) -> set[tuple[str, str]]:
        """The (kind, pipeline) pairs that `workers` serve (as they say of themselves)."""
        if not workers:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for name in workers:
            pipe.hmget(keys.worker(name), ["kind", "pipeline"])
        return {(kind, pipeline or "") for kind, pipeline in await pipe.execute() if kind}

    async def starts_of(self, pipelines: Sequence[str]) -> list[dict[str, str]]:
        """The last start recorded of each of `pipelines`, in order (`LivenessStore.start_of`)."""
        pipe = self.r.pipeline(transaction=False)
        for name in pipelines:
            pipe.hgetall(keys.pipeline_state(name))
        return [text_map(state) for state in await pipe.execute()]
