"""What `/readyz` reads of the deployment: whether Redis answers, and which job kinds
have a live worker (one whose heartbeat is recent)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis.asyncio as aredis
from redis.exceptions import RedisError

from jobs import keys
from jobs.settings import Settings

STALE_HEARTBEATS = 3
"""A worker is live while its last heartbeat is under this many heartbeat periods old."""


@dataclass
class Readiness:
    kinds: list[str] = field(default_factory=list)
    """Kinds with a live worker."""
    missing: list[str] = field(default_factory=list)
    """What keeps the deployment from being ready; empty when it is."""


class Health:
    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._r = client
        self._settings = settings

    async def readiness(self) -> Readiness:
        try:
            await self._r.ping()
            live = await self.live_kinds()
        except (RedisError, OSError) as exc:
            return Readiness(missing=[f"redis: {exc}"])
        enabled = self._settings.enabled_kinds
        missing = [f"worker for kind {k}" for k in enabled if k not in live]
        return Readiness(sorted(live), missing)

    async def live_kinds(self) -> set[str]:
        stale_s = self._settings.lease.heartbeat_s * STALE_HEARTBEATS
        names = await self._r.zrangebyscore(keys.WORKERS, time.time() - stale_s, "+inf")
        if not names:
            return set()
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            pipe.hget(keys.worker(str(name)), "kind")
        return {kind for kind in await pipe.execute() if kind}
