"""`GET /metrics`: the whole deployment in one Prometheus scrape of any API process.

Counters and histograms come from Redis, where every process writes them
(`telemetry/metric_defs.py`); gauges are read at scrape time: queue depth by pipeline and priority
(the length of each Celery list), queued and running jobs, live workers, and the last
GPU readings that workers stored (`jobstore.deployment_reader.DeploymentReader.snapshot`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

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

from api import autoscale
from jobs.settings import Settings
from jobstore.deployment_reader import DeploymentReader, Snapshot
from jobstore.pipeline_signals import PipelineSignalsReader
from jobstore.quotas import Quota
from jobstore.realtime_sessions import AsyncRealtimeSessions
from telemetry.metric_defs import RECORDED, MetricDef

WORKER_LABELS = ("worker", "kind", "pipeline", "device", "host")
GPU_LABELS = ("host", "device", "uuid", "name")


class MetricsReader:
    """What `/metrics` reads, built once per process (routes never hold the client)."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._reader = DeploymentReader(client)
        self._realtime = AsyncRealtimeSessions(client)
        self._signals = PipelineSignalsReader(client)
        self._settings = settings

    async def snapshot(self, per_key: bool = True) -> Snapshot:
        """The deployment now; `per_key`: with each key's usage (it names owners)."""
        snap = await self._reader.snapshot(self._settings, per_key)
        pipelines = list(self._settings.enabled_pipelines)
        snap.pipelines = await self._signals.read(pipelines, snap.at, autoscale.waiting_of(snap))
        snap.realtime_log_bytes = await self._realtime.log_bytes()
        return snap


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
    yield GaugeMetricFamily(
        "mmq_realtime_sessions_active",
        "Voice sessions open now (`/v1/realtime`), across the API processes.",
        value=snap.realtime_sessions,
    )
    yield GaugeMetricFamily(
        "mmq_realtime_log_bytes",
        "Bytes that the kept event logs of voice sessions hold in Redis, every owner's "
        "(bounded by realtime.max_session_log_bytes and realtime.max_key_log_bytes).",
        value=snap.realtime_log_bytes,
    )
    yield from _workers(snap, settings.lease.heartbeat_s * 3)
    yield from autoscale.families(snap, settings)
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
