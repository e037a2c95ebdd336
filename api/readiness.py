"""What `/readyz` reads of the deployment: whether Redis answers, which job kinds have a
live worker (one whose heartbeat is recent), and which pipelines have none (their jobs
wait queued for the first worker that starts). For a kind without one, what its
pipelines' workers recorded of their start (`LivenessStore.record_start`) says why:
still loading, or failed with the reason; where workers scale to zero
(`autoscale.ready_without_workers`), a kind without one is no reason to be unready."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis.asyncio as aredis
from redis.exceptions import RedisError

from jobs.settings import Settings
from jobstore.deployment_reader import DeploymentReader
from jobstore.liveness import AsyncLiveness

STALE_HEARTBEATS = 3
"""A worker is live while its last heartbeat is under this many heartbeat periods old."""


@dataclass
class Readiness:
    kinds: list[str] = field(default_factory=list)
    """Kinds with a live worker."""
    missing: list[str] = field(default_factory=list)
    """What keeps the deployment from being ready; empty when it is."""
    cold: list[str] = field(default_factory=list)
    """On-demand pipelines that no worker has loaded now: ready, their next job loads."""
    no_workers: list[str] | None = None
    """Enabled pipelines without a live worker: their jobs are accepted and wait queued
    (None: Redis did not answer)."""


class Health:
    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._liveness = AsyncLiveness(client)
        self._deployment = DeploymentReader(client)
        self._settings = settings

    async def readiness(self) -> Readiness:
        try:
            await self._liveness.ping()
            stale_s = self._settings.lease.heartbeat_s * STALE_HEARTBEATS
            workers = await self._liveness.live_workers(stale_s)
            served = await self._liveness.served_by(workers)
            live = {kind for kind, _ in served}
            missing = []
            for kind in self._settings.enabled_kinds:
                if kind not in live and not self._settings.autoscale.ready_without_workers:
                    missing += await self.why_not(kind) or [f"worker for kind {kind}"]
            cold = await self.cold_pipelines(set(workers))
        except (RedisError, OSError) as exc:
            return Readiness(missing=[f"redis: {exc}"])
        pipelines = {pipeline for _, pipeline in served}
        no_workers = [name for name in self._settings.enabled_pipelines if name not in pipelines]
        return Readiness(sorted(live), missing, cold, sorted(no_workers))

    async def cold_pipelines(self, live: set[str]) -> list[str]:
        """The on-demand pipelines that no live worker (`live`) has loaded now."""
        on_demand = [
            name
            for name, config in self._settings.enabled_pipelines.items()
            if config.residency == "on_demand"
        ]
        if not on_demand:
            return []
        loaded = {model.pipeline for model in await self._deployment.loaded_models(live)}
        return [name for name in on_demand if name not in loaded]

    async def why_not(self, kind: str) -> list[str]:
        """What the kind's pipelines recorded of their last start, one line each."""
        names = [n for n, p in self._settings.enabled_pipelines.items() if p.kind == kind]
        states = await self._liveness.starts_of(names)
        return [
            f"pipeline {name}: {line}"
            for name, state in zip(names, states, strict=True)
            if (line := start_line(state))
        ]


def start_line(state: dict[str, str]) -> str:
    """One line of a pipeline's recorded start; empty when nothing tells more than "no
    live worker" (never started, or ready and gone since)."""
    reason = " | ".join(state.get("reason", "").splitlines())
    if state.get("state") == "failed":
        return reason
    if state.get("state") != "loading":
        return ""
    since_s = time.time() - float(state.get("at") or time.time())
    line = f"loading on {state.get('worker', '?')} ({since_s:.0f}s)"
    return f"{line}; the last start failed: {reason}" if reason else line
