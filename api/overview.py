"""`GET /v1/admin/overview`: the deployment at a glance, for the web console.

Per pipeline: queued messages by priority, running jobs, jobs/s and p50/p95 queue wait
and end-to-end time over the last few minutes, 429s; every live worker (its heartbeat
age, jobs in flight, current batch size); every GPU or MIG slice that workers read.

It reads what `/metrics` reads (`DeploymentReader.snapshot`: queue lengths, the queued
sets, workers, device readings) plus the per-minute counts of `jobstore/recent_counts.py`
and the pipelines of the running jobs (`DeploymentReader.recent_and_running`: two round
trips more).
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import redis.asyncio as aredis
from pydantic import BaseModel, Field

from jobs.settings import Settings
from jobstore import recent_counts
from jobstore.deployment_reader import DeploymentReader, LoadedModel, Snapshot
from jobstore.quotas import Quota
from jobstore.recent_counts import Counts

RUNNING_READ_MAX = 10_000
"""Running jobs whose pipeline one overview reads at most."""


class Percentiles(BaseModel):
    """Estimated from histogram buckets (linear within a bucket, as Prometheus's
    `histogram_quantile`); None without samples."""

    count: int
    p50_ms: float | None
    p95_ms: float | None


class PipelineOverview(BaseModel):
    pipeline: str
    kind: str
    queued: dict[str, int]
    """Messages waiting in its queue, by priority (`high`, `normal`, `low`)."""
    queued_total: int
    running: int
    """Its jobs running now."""
    workers: int
    """Live workers serving it."""
    ended: dict[str, int]
    """Jobs that ended in the window, by status."""
    jobs_per_s: float
    """Jobs that ended per second over the window."""
    rejected: int
    """Submits refused with 429 (its kind's queue was full) in the window."""
    queue_wait: Percentiles
    """Submit (or requeue) to start, of the jobs that started in the window."""
    end_to_end: Percentiles
    """Submit to end, of the jobs that succeeded in the window."""


class KindOverview(BaseModel):
    kind: str
    queued: int
    """Queued jobs, as admission control counts them."""
    max_queued: int
    """Queued jobs before submits get 429."""


class WorkerOverview(BaseModel):
    name: str
    host: str
    device: str
    """`cpu`, `gpu:N` or `mig:UUID`."""
    kind: str
    pipeline: str
    instance: int | None
    pid: int | None
    heartbeat_age_s: float
    up: bool
    """Its heartbeat is recent (at most three heartbeat intervals old)."""
    in_flight: int
    """Jobs it holds leases on, at its last heartbeat."""
    batch_size: int
    """Requests in the batches it ran at its last heartbeat (0: idle)."""


class DeviceOverview(BaseModel):
    """The last NVML reading of a GPU or MIG slice that a worker uses."""

    host: str
    device: str
    uuid: str
    name: str
    utilization: float | None
    """Busy fraction, 0..1 (None on MIG slices: NVML has none)."""
    memory_used_bytes: int
    memory_total_bytes: int


class Overview(BaseModel):
    at: datetime
    """When it was read (Redis's clock)."""
    window_s: float
    """The span the rates and percentiles cover: the last full minutes and this one so far."""
    pipelines: list[PipelineOverview]
    kinds: list[KindOverview]
    running_total: int
    workers: list[WorkerOverview]
    devices: list[DeviceOverview] = Field(default_factory=list)
    """Empty where no worker has a GPU (or NVML)."""
    keys: list[Quota] = Field(default_factory=list)
    """Each key's limits and usage (the first `quotas.shown_keys` owners by name)."""
    models: list[LoadedModel] = Field(default_factory=list)
    """The models loaded on each device now (resident, and on demand)."""


class OverviewReader:
    """Builds overviews, once per process (routes never hold the client)."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._reader = DeploymentReader(client)
        self._settings = settings

    async def read(self, minutes: int = 5) -> Overview:
        """The overview, with rates and percentiles over the last `minutes` full minutes
        and the current one."""
        snap = await self._reader.snapshot(self._settings)
        now = snap.at
        current = recent_counts.minute_of(now)
        counts, running = await self._reader.recent_and_running(
            current - minutes, current, RUNNING_READ_MAX
        )
        window_s = minutes * 60 + (now - current * 60)
        return Overview(
            at=datetime.fromtimestamp(now, tz=UTC),
            window_s=round(window_s, 3),
            pipelines=self._pipelines(snap, counts, running, window_s),
            kinds=[
                KindOverview(kind=k, queued=n, max_queued=self._settings.queue.limit_for(k))
                for k, n in sorted(snap.queued.items())
            ],
            running_total=snap.running,
            workers=_workers(snap, self._settings.lease.heartbeat_s * 3),
            devices=_devices(snap),
            keys=snap.keys,
            models=snap.models,
        )

    def _pipelines(
        self,
        snap: Snapshot,
        counts: Counts,
        running: Counter[str],
        window_s: float,
    ) -> list[PipelineOverview]:
        live = Counter(info.get("pipeline", "") for info, _age in snap.workers)
        out = []
        for name, config in sorted(self._settings.enabled_pipelines.items()):
            kind = config.kind
            queued = {p: n for (pl, _k, p), n in snap.depth.items() if pl == name}
            ended = {
                key[3]: n
                for key, n in counts.items()
                if key[:3] == ("ended", kind, name) and len(key) == 4
            }
            out.append(
                PipelineOverview(
                    pipeline=name,
                    kind=kind,
                    queued=queued,
                    queued_total=sum(queued.values()),
                    running=running.get(name, 0),
                    workers=live.get(name, 0),
                    ended=ended,
                    jobs_per_s=round(sum(ended.values()) / window_s, 4) if window_s else 0.0,
                    rejected=counts.get(("rejected", kind, name), 0),
                    queue_wait=_percentiles(counts, "queue_wait", kind, name),
                    end_to_end=_percentiles(counts, "end_to_end", kind, name),
                )
            )
        return out


def _percentiles(counts: Counts, series: str, kind: str, pipeline: str) -> Percentiles:
    metric = recent_counts.HISTOGRAMS[series]
    cells = {key[3]: n for key, n in counts.items() if key[:3] == (series, kind, pipeline)}
    bounds = [*metric.buckets, float("inf")]
    per_bucket = [cells.get(repr(b), 0) for b in metric.buckets] + [cells.get("+Inf", 0)]
    total = sum(per_bucket)
    return Percentiles(
        count=total,
        p50_ms=_quantile(0.5, bounds, per_bucket, total),
        p95_ms=_quantile(0.95, bounds, per_bucket, total),
    )


def _quantile(q: float, bounds: list[float], per_bucket: list[int], total: int) -> float | None:
    """The q-quantile in ms: linear within its bucket; in the last (unbounded) bucket,
    the largest finite bound."""
    if total == 0:
        return None
    rank = q * total
    seen, lower = 0, 0.0
    for bound, n in zip(bounds, per_bucket, strict=True):
        if n and seen + n >= rank:
            if bound == float("inf"):
                return round(lower * 1000, 3)
            return round((lower + (bound - lower) * (rank - seen) / n) * 1000, 3)
        seen += n
        lower = bound
    return round(lower * 1000, 3)


def _workers(snap: Snapshot, stale_s: float) -> list[WorkerOverview]:
    return [
        WorkerOverview(
            name=info["worker"],
            host=info.get("host", ""),
            device=info.get("device", ""),
            kind=info.get("kind", ""),
            pipeline=info.get("pipeline", ""),
            instance=_int_or_none(info.get("instance")),
            pid=_int_or_none(info.get("pid")),
            heartbeat_age_s=round(max(0.0, age), 3),
            up=age <= stale_s,
            in_flight=_int_or_none(info.get("in_flight")) or 0,
            batch_size=_int_or_none(info.get("batch_size")) or 0,
        )
        for info, age in sorted(snap.workers, key=lambda w: w[0]["worker"])
    ]


def _devices(snap: Snapshot) -> list[DeviceOverview]:
    return [
        DeviceOverview(
            host=d.get("host", ""),
            device=d.get("device", ""),
            uuid=d.get("uuid", ""),
            name=d.get("name", ""),
            utilization=float(d["utilization"]) if d.get("utilization") else None,
            memory_used_bytes=int(d.get("memory_used_bytes") or 0),
            memory_total_bytes=int(d.get("memory_total_bytes") or 0),
        )
        for d in sorted(snap.devices, key=lambda d: (d.get("host", ""), d.get("device", "")))
    ]


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
