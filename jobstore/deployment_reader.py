"""What `/metrics` and the admin overview read of the deployment in Redis: the metric
counters (`jobstore/metric_counts.py`), each pipeline's Celery list lengths, the queued
sets, the running jobs, the workers' heartbeats and what they say of themselves, the
device and backend readings (`jobstore/readings.py`), the models loaded on each device,
the active batches, the jobs held by fair share and each key's usage; and, for the
overview, the per-minute counts (`jobstore/recent_counts.py`) and the pipelines of the
running jobs. Reads only (and the pruning of stale device and backend index entries),
each batch of them pipelined.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import redis.asyncio as aredis
from pydantic import BaseModel

from broker.kombu_redis import priority_lists
from broker.queues import queue_name
from jobs import keys
from jobs.device_models import ModelEntry, split_member
from jobs.settings import Settings
from jobstore import quotas
from jobstore.codec import text_list, text_map, time_seconds
from jobstore.pipeline_signals import PipelineReading
from jobstore.quotas import READS, Quota
from jobstore.recent_counts import Counts, add_up
from telemetry.metric_defs import RECORDED

DEVICE_KEEP_S = 3600
"""Readings older than this leave the device index (their hashes expired long before)."""


class LoadedModel(BaseModel):
    """A model loaded in a worker, as its device counts it (`workers.residency`)."""

    pipeline: str
    host: str
    device: str
    worker: str
    bytes: int
    resident: bool
    loaded_at: float
    idle_since: float | None
    """When it last had no job (None while it has work)."""


@dataclass
class Snapshot:
    """What one scrape read from Redis."""

    recorded: dict[str, dict[str, str]] = field(default_factory=dict)
    """Each kept metric's hash (`jobstore/metric_counts.py`), by the metric's name."""
    depth: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Messages in each Celery list, by (pipeline, kind, priority)."""
    queued: dict[str, int] = field(default_factory=dict)
    running: int = 0
    workers: list[tuple[dict[str, str], float]] = field(default_factory=list)
    """What each recently beating worker says of itself (with its name as `worker`), and
    the seconds since its heartbeat."""
    devices: list[dict[str, str]] = field(default_factory=list)
    backends: list[dict[str, str]] = field(default_factory=list)
    """The last readings of each worker's backend (an LLM engine's own gauges)."""
    batches: dict[str, int] = field(default_factory=dict)
    """Active batches by status."""
    batch_lines: dict[str, int] = field(default_factory=dict)
    """Lines of the active batches by state: waiting, in_flight, completed, failed."""
    held: dict[str, int] = field(default_factory=dict)
    """Jobs held by fair share, by `pipeline|priority`."""
    keys: list[Quota] = field(default_factory=list)
    """Usage and limits of each key shown (`quotas.shown_keys`), by owner (`Quota.owner`)."""
    models: list[LoadedModel] = field(default_factory=list)
    """The models loaded on each device, of live workers."""
    realtime_sessions: int = 0
    """Voice sessions open now (`jobstore.realtime_sessions`)."""
    realtime_log_bytes: int = 0
    """Bytes that the kept voice session event logs hold (`jobstore.realtime_sessions`)."""
    at: float = 0.0
    """When it was read (Redis's clock, unix seconds)."""
    pipelines: dict[str, PipelineReading] = field(default_factory=dict)
    """Each enabled pipeline's oldest waiting job and recent run times, where the reader
    read them (`/metrics`: `jobstore.pipeline_signals`)."""


class DeploymentReader:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client

    async def snapshot(self, settings: Settings, per_key: bool = True) -> Snapshot:
        """The deployment now; `per_key`: with each key's usage (it names owners)."""
        r = self._r
        snap = Snapshot()
        lists = [
            (name, config.kind, priority, key)
            for name, config in settings.enabled_pipelines.items()
            for priority, key in priority_lists(queue_name(name)).items()
        ]
        now = time_seconds(await r.time())  # heartbeats and readings are in Redis's time
        snap.at = now
        pipe = r.pipeline(transaction=False)
        for metric in RECORDED:
            pipe.hgetall(keys.metric(metric.name))
        for *_, key in lists:
            pipe.llen(key)
        for kind in settings.enabled_kinds:
            pipe.scard(keys.queued(kind))
        pipe.zcard(keys.RUNNING)
        # A worker's hash lives 5 heartbeats; older entries (killed workers) have nothing left.
        recent = now - 6 * settings.lease.heartbeat_s - 1
        pipe.zrangebyscore(keys.WORKERS, recent, "+inf", withscores=True)
        pipe.zremrangebyscore(keys.DEVICES, "-inf", now - DEVICE_KEEP_S)
        pipe.zrange(keys.DEVICES, 0, -1)
        pipe.zremrangebyscore(keys.BACKENDS, "-inf", now - DEVICE_KEEP_S)
        pipe.zrange(keys.BACKENDS, 0, -1)
        pipe.zcount(keys.REALTIME_LIVE, f"({now}", "+inf")  # scored by when each hold ends
        results = iter(await pipe.execute())
        snap.recorded = {metric.name: next(results) for metric in RECORDED}
        snap.depth = {(n, kind, pri): int(next(results)) for n, kind, pri, _ in lists}
        snap.queued = {kind: int(next(results)) for kind in settings.enabled_kinds}
        snap.running = int(next(results))
        workers: list[tuple[str, float]] = next(results)
        next(results)
        devices: list[str] = next(results)
        next(results)
        backends: list[str] = next(results)
        snap.realtime_sessions = int(next(results))
        pipe = r.pipeline(transaction=False)
        for name, _ in workers:
            pipe.hgetall(keys.worker(name))
        for device in devices:
            pipe.hgetall(keys.device(device))
        for worker in backends:
            pipe.hgetall(keys.backend(worker))
        found = await pipe.execute()
        snap.workers = [
            ({"worker": name, **info}, now - beat)
            for (name, beat), info in zip(workers, found, strict=False)
            if info
        ]
        snap.devices = [info for info in found[len(workers) : len(workers) + len(devices)] if info]
        snap.backends = [info for info in found[len(workers) + len(devices) :] if info]
        live = {name for name, beat in workers if now - beat <= settings.lease.heartbeat_s * 3}
        snap.models = await self.loaded_models(live)
        await self._read_batches(snap)
        if per_key:
            await self._read_keys(snap, settings)
        snap.held = {k: int(v) for k, v in text_map(await r.hgetall(keys.HELD)).items()}
        return snap

    async def loaded_models(self, live: set[str]) -> list[LoadedModel]:
        """The models of every device, of the workers in `live`."""
        members = text_list(await self._r.smembers(keys.MODEL_DEVICES))
        devices = sorted(split_member(d) for d in members)
        pipe = self._r.pipeline(transaction=False)
        for host, device in devices:
            pipe.hgetall(keys.device_models(host, device))
        models = []
        for (host, device), entries in zip(devices, await pipe.execute(), strict=True):
            for worker, raw in sorted(text_map(entries).items()):
                if worker not in live:
                    continue
                entry = ModelEntry.model_validate_json(raw)
                models.append(
                    LoadedModel(
                        **entry.model_dump(exclude={"idle_since"}), host=host, device=device,
                        worker=worker, idle_since=entry.idle_since or None,
                    )
                )  # fmt: skip
        return models

    async def recent_and_running(
        self, first_minute: int, last_minute: int, running_max: int
    ) -> tuple[Counts, Counter[str]]:
        """The per-minute counts from `first_minute` to `last_minute` (both included),
        summed; and the running jobs (the first `running_max`) by pipeline."""
        pipe = self._r.pipeline(transaction=False)
        for minute in range(first_minute, last_minute + 1):
            pipe.hgetall(keys.recent(minute))
        pipe.zrange(keys.RUNNING, 0, running_max - 1)
        *minutes, running_ids = await pipe.execute()
        counts = add_up(minutes)
        pipe = self._r.pipeline(transaction=False)
        for job_id in running_ids:
            pipe.hget(keys.job(job_id), "pipeline")
        running = Counter(p for p in await pipe.execute() if p) if running_ids else Counter()
        return counts, running

    async def _read_keys(self, snap: Snapshot, settings: Settings) -> None:
        shown = settings.quotas.shown_keys
        if not shown:
            return
        owners = sorted(text_list(await self._r.smembers(keys.OWNERS)))[:shown]
        window = int(snap.at // settings.quotas.window_s)
        pipe = self._r.pipeline(transaction=False)
        for owner in owners:
            quotas.reads(pipe, owner, window)
        found = await pipe.execute()
        for i, owner in enumerate(owners):
            replies = found[READS * i : READS * (i + 1)]
            snap.keys.append(quotas.from_reads(settings.quotas, replies, owner))

    async def _read_batches(self, snap: Snapshot) -> None:
        ids = text_list(await self._r.smembers(keys.BATCHES_ACTIVE))
        pipe = self._r.pipeline(transaction=False)
        for batch_id in ids:
            pipe.hmget(keys.batch(batch_id), ["status", "completed", "failed"])
            pipe.llen(keys.batch_lines(batch_id))
            pipe.hlen(keys.batch_inflight(batch_id))
        found = await pipe.execute()
        lines = dict.fromkeys(("waiting", "in_flight", "completed", "failed"), 0)
        for i in range(len(ids)):
            (status, completed, failed), waiting, in_flight = found[3 * i : 3 * i + 3]
            if status is None:
                continue
            snap.batches[status] = snap.batches.get(status, 0) + 1
            lines["waiting"] += int(waiting)
            lines["in_flight"] += int(in_flight)
            lines["completed"] += int(completed or 0)
            lines["failed"] += int(failed or 0)
        snap.batch_lines = lines
