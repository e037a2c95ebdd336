"""`GET /metrics`: the whole deployment in one Prometheus scrape of any API process.

Counters and histograms come from Redis, where every process writes them
(`telemetry/metrics.py`); gauges are read at scrape time: queue depth by pipeline and priority
(the length of each Celery list), queued and running jobs, live workers, and the last
GPU readings that workers stored. Two pipelined round trips per scrape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import redis.asyncio as aredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from pydantic import BaseModel

from broker.kombu_redis import priority_lists
from broker.queues import queue_name
from jobs import keys
from jobs.device_models import ModelEntry, split_member
from jobs.settings import Settings
from jobstore import quotas
from jobstore.codec import text_list, text_map, time_seconds
from jobstore.quotas import READS, Quota
from telemetry.metrics import RECORDED, MetricDef

WORKER_LABELS = ("worker", "kind", "pipeline", "device", "host")
GPU_LABELS = ("host", "device", "uuid", "name")
DEVICE_KEEP_S = 3600
"""Readings older than this leave the device index (their hashes expired long before)."""


@dataclass
class Snapshot:
    """What one scrape read from Redis."""

    recorded: dict[str, dict[str, str]] = field(default_factory=dict)
    depth: dict[tuple[str, str, str], int] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    running: int = 0
    workers: list[tuple[dict[str, str], float]] = field(default_factory=list)
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
    """The models loaded on each device (`keys.device_models`), of live workers."""
    at: float = 0.0
    """When it was read (Redis's clock, unix seconds)."""


class MetricsReader:
    """What `/metrics` reads, built once per process (routes never hold the client)."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._r = client
        self._settings = settings

    async def snapshot(self, per_key: bool = True) -> Snapshot:
        """The deployment now; `per_key`: with each key's usage (it names owners)."""
        return await read_snapshot(self._r, self._settings, per_key)


async def read_snapshot(r: aredis.Redis, settings: Settings, per_key: bool = True) -> Snapshot:
    snap = Snapshot()
    pipelines = settings.enabled_pipelines
    lists = [
        (name, config.kind, priority, key)
        for name, config in pipelines.items()
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
    snap.models = await read_models(r, live)
    await _read_batches(r, snap)
    if per_key:
        await _read_keys(r, snap, settings)
    snap.held = {k: int(v) for k, v in text_map(await r.hgetall(keys.HELD)).items()}
    return snap


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


async def read_models(r: aredis.Redis, live: set[str]) -> list[LoadedModel]:
    """The models of every device, of the workers in `live`."""
    devices = sorted(split_member(d) for d in text_list(await r.smembers(keys.MODEL_DEVICES)))
    pipe = r.pipeline(transaction=False)
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


async def _read_keys(r: aredis.Redis, snap: Snapshot, settings: Settings) -> None:
    shown = settings.quotas.shown_keys
    if not shown:
        return
    owners = sorted(text_list(await r.smembers(keys.OWNERS)))[:shown]
    window = int(snap.at // settings.quotas.window_s)
    pipe = r.pipeline(transaction=False)
    for owner in owners:
        quotas.reads(pipe, owner, window)
    found = await pipe.execute()
    for i, owner in enumerate(owners):
        replies = found[READS * i : READS * (i + 1)]
        snap.keys.append(quotas.from_reads(settings.quotas, replies, owner))


async def _read_batches(r: aredis.Redis, snap: Snapshot) -> None:
    ids = text_list(await r.smembers(keys.BATCHES_ACTIVE))
    pipe = r.pipeline(transaction=False)
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


def families(snap: Snapshot, settings: Settings) -> Iterator[Metric]:
    for metric in RECORDED:
        yield _recorded(metric, snap.recorded.get(metric.name, {}))
    depth = GaugeMetricFamily(
        "mmq_queue_depth",
        "Messages waiting in a pipeline's Celery queue, by priority.",
        labels=["kind", "pipeline", "priority"],
    )
    for (pipeline, kind, priority), n in sorted(snap.depth.items()):
        depth.add_metric([kind, pipeline, priority], n)
    yield depth
    queued = GaugeMetricFamily(
        "mmq_jobs_queued", "Jobs queued, by kind (what admission control counts).", labels=["kind"]
    )
    for kind, n in sorted(snap.queued.items()):
        queued.add_metric([kind], n)
    yield queued
    yield GaugeMetricFamily("mmq_jobs_running", "Jobs running now.", value=snap.running)
    batches = GaugeMetricFamily(
        "mmq_batches_active", "Batches not yet ended, by status.", labels=["status"]
    )
    for status, n in sorted(snap.batches.items()):
        batches.add_metric([status], n)
    yield batches
    lines = GaugeMetricFamily(
        "mmq_batch_lines",
        "Lines of the batches not yet ended: waiting to be released, in flight (released, "
        "not collected), completed, failed.",
        labels=["state"],
    )
    for state, n in snap.batch_lines.items():
        lines.add_metric([state], n)
    yield lines
    yield from _keys(snap.keys)
    held = GaugeMetricFamily(
        "mmq_jobs_held",
        "Jobs held by fair share until their key's turn, by pipeline and priority.",
        labels=["pipeline", "priority"],
    )
    for field_name, n in sorted(snap.held.items()):
        pipeline, _, priority = field_name.partition("|")
        held.add_metric([pipeline, priority], max(0, n))
    yield held
    loaded = GaugeMetricFamily(
        "mmq_models_loaded",
        "Models loaded now, by pipeline, host and device (resident ones and those loaded on "
        "demand).",
        labels=["pipeline", "host", "device"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    for model in snap.models:
        labels = (model.pipeline, model.host, model.device)
        counts[labels] = counts.get(labels, 0) + 1
    for labels, n in sorted(counts.items()):
        loaded.add_metric(list(labels), n)
    yield loaded
    yield from _workers(snap, settings.lease.heartbeat_s * 3)
    yield from _devices(snap.devices)
    yield from _backends(snap.backends)


def _recorded(metric: MetricDef, fields: dict[str, str]) -> Metric:
    rows = sorted((json.loads(f), v) for f, v in fields.items())
    if not metric.histogram:
        counter = CounterMetricFamily(metric.name, metric.help, labels=list(metric.labels))
        for labels, value in rows:
            counter.add_metric(labels, float(value))
        return counter
    histogram = HistogramMetricFamily(metric.name, metric.help, labels=list(metric.labels))
    series: dict[tuple[str, ...], dict[str, float]] = {}
    for values, value in rows:
        series.setdefault(tuple(values[:-1]), {})[values[-1]] = float(value)
    for labels, cells in sorted(series.items()):
        total = 0.0
        buckets: list[tuple[str, float]] = []
        for bound in metric.buckets:
            total += cells.get(repr(bound), 0.0)
            buckets.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
        buckets.append(("+Inf", total + cells.get("+Inf", 0.0)))
        histogram.add_metric(list(labels), buckets, cells.get("sum", 0.0))
    return histogram


def _workers(snap: Snapshot, stale_s: float) -> Iterable[Metric]:
    up = GaugeMetricFamily(
        "mmq_worker_up",
        "1 for a worker whose heartbeat is recent, 0 for one that stopped beating.",
        labels=list(WORKER_LABELS),
    )
    age = GaugeMetricFamily(
        "mmq_worker_heartbeat_age_seconds",
        "Seconds since the worker's last heartbeat.",
        labels=list(WORKER_LABELS),
    )
    for info, seconds in snap.workers:
        labels = [info.get(name, "") for name in WORKER_LABELS]
        up.add_metric(labels, 1.0 if seconds <= stale_s else 0.0)
        age.add_metric(labels, max(0.0, seconds))
    return [up, age]


def _keys(quotas: list[Quota]) -> Iterable[Metric]:
    queued = GaugeMetricFamily(
        "mmq_key_jobs_queued", "A key's jobs queued now (batch lines apart).", labels=["owner"]
    )
    used = GaugeMetricFamily(
        "mmq_key_requests", "Jobs a key submitted in the current quota window.", labels=["owner"]
    )
    running = GaugeMetricFamily(
        "mmq_key_jobs_running",
        "A key's jobs released to the workers now (running, or next in a queue).",
        labels=["owner"],
    )
    cost = GaugeMetricFamily(
        "mmq_key_cost",
        "What a key's jobs of a kind cost in the current quota window (its unit: "
        "LLM and embedding tokens, ASR audio seconds, TTS characters, image "
        "megapixel-steps).",
        labels=["owner", "kind"],
    )
    limit = GaugeMetricFamily(
        "mmq_key_limit",
        "A key's limits in effect (0: none): max_queued, requests per quotas.window_s, "
        "max_running, and cost.KIND per quotas.window_s.",
        labels=["owner", "quota"],
    )
    for q in quotas:
        queued.add_metric([q.owner], q.queued)
        used.add_metric([q.owner], q.requests_used)
        running.add_metric([q.owner], q.running)
        limit.add_metric([q.owner, "max_queued"], q.max_queued)
        limit.add_metric([q.owner, "requests"], q.requests)
        limit.add_metric([q.owner, "max_running"], q.max_running)
        for kind, use in q.costs.items():
            cost.add_metric([q.owner, kind], use.used)
            limit.add_metric([q.owner, f"cost.{kind}"], use.limit)
    return [queued, used, running, cost, limit]


ENGINE_LABELS = ("pipeline", "worker", "host")
ENGINE_GAUGES = {
    "requests_running": ("mmq_engine_requests_running", "Sequences the LLM engine runs now."),
    "requests_waiting": (
        "mmq_engine_requests_waiting",
        "Sequences waiting inside the LLM engine (its own queue, after mmq's admission).",
    ),
    "kv_cache_usage": ("mmq_engine_kv_cache_usage_ratio", "Share of the KV cache in use."),
}
ENGINE_COUNTERS = {
    "prefix_cache_queries": (
        "mmq_engine_prefix_cache_queries",
        "Prompt tokens looked up in the engine's prefix cache since it started.",
    ),
    "prefix_cache_hits": (
        "mmq_engine_prefix_cache_hits",
        "Prompt tokens found in the engine's prefix cache since it started.",
    ),
    "preemptions": ("mmq_engine_preemptions", "Sequences the engine preempted since it started."),
    "generation_tokens": (
        "mmq_engine_generation_tokens",
        "Tokens the engine generated since it started (a sequence aborted stops adding).",
    ),
}


def _backends(readings: list[dict[str, str]]) -> Iterable[Metric]:
    """An LLM engine's own gauges (vLLM's `/metrics`), by pipeline and worker."""
    out: list[Metric] = []
    for field_name, (name, doc) in ENGINE_GAUGES.items():
        out.append(_reading(GaugeMetricFamily(name, doc, labels=list(ENGINE_LABELS)),
                            readings, field_name))  # fmt: skip
    for field_name, (name, doc) in ENGINE_COUNTERS.items():
        out.append(_reading(CounterMetricFamily(name, doc, labels=list(ENGINE_LABELS)),
                            readings, field_name))  # fmt: skip
    ratio = GaugeMetricFamily(
        "mmq_engine_prefix_cache_hit_ratio",
        "Share of the prompt tokens looked up since the engine started that its prefix cache "
        "held (hits / queries).",
        labels=list(ENGINE_LABELS),
    )
    for info in readings:
        queries = float(info.get("prefix_cache_queries") or 0)
        if queries > 0:
            hits = float(info.get("prefix_cache_hits") or 0)
            ratio.add_metric([info.get(n, "") for n in ENGINE_LABELS], hits / queries)
    return [*out, ratio]


def _reading(
    family: GaugeMetricFamily | CounterMetricFamily, readings: list[dict[str, str]], field: str
) -> Metric:
    for info in readings:
        if info.get(field):
            family.add_metric([info.get(n, "") for n in ENGINE_LABELS], float(info[field]))
    return family


def _devices(readings: list[dict[str, str]]) -> Iterable[Metric]:
    util = GaugeMetricFamily(
        "mmq_gpu_utilization_ratio",
        "GPU busy fraction (0..1) over NVML's last sample period (absent on MIG slices).",
        labels=list(GPU_LABELS),
    )
    used = GaugeMetricFamily(
        "mmq_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=list(GPU_LABELS)
    )
    total = GaugeMetricFamily(
        "mmq_gpu_memory_total_bytes", "GPU memory (NVML).", labels=list(GPU_LABELS)
    )
    for reading in readings:
        labels = [reading.get(name, "") for name in GPU_LABELS]
        if reading.get("utilization"):
            util.add_metric(labels, float(reading["utilization"]))
        used.add_metric(labels, float(reading.get("memory_used_bytes") or 0))
        total.add_metric(labels, float(reading.get("memory_total_bytes") or 0))
    return [util, used, total]


class _Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


def render(snap: Snapshot, settings: Settings) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families(snap, settings))))
    return generate_latest(registry)
