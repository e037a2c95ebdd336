"""Each pipeline's signals to scale on, in `/metrics` (docs: operations/monitoring.md,
"Autoscaling"), from one scrape's reads (`jobstore.deployment_reader.Snapshot` and its
`pipelines`, `jobstore.pipeline_signals`):

- `mmq_pipeline_jobs_waiting`: messages in its Celery lists (every priority, batch lines
  released included) and jobs that fair share holds for it;
- `mmq_pipeline_oldest_wait_seconds`: how long the oldest of them has waited (0: none);
- `mmq_pipeline_jobs_running`, `mmq_pipeline_slots_live`: what its live workers run, and
  the jobs they may run at once, as their last heartbeats say;
- `mmq_pipeline_service_seconds`: the mean run time of its jobs that ended in the last
  minutes (absent before one has);
- `mmq_pipeline_desired_workers`: `desired_workers`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from pydantic import ValidationError

from api.readiness import STALE_HEARTBEATS
from jobs.schemas.llm_options import LlmOptions
from jobs.settings import PipelineConfig, Settings
from jobstore.deployment_reader import Snapshot
from jobstore.pipeline_signals import PipelineReading

EPSILON = 1e-9
"""Slack of a ceiling: 4.000000001 slots is 4."""


@dataclass(frozen=True)
class PipelineSignals:
    pipeline: str
    waiting: int
    oldest_wait_s: float
    running: int
    workers_live: int
    slots_live: int
    slots_per_worker: int
    """Of a live worker (their mean), or of the one to start (the settings)."""
    service_s: float | None
    desired: int


def desired_workers(
    waiting: int,
    running: int,
    service_s: float | None,
    slots_per_worker: int,
    target_wait_s: float,
    max_workers: int,
) -> int:
    """The workers that run the jobs waiting and running now within `target_wait_s`.

    Each job holds a slot for `service_s`, so they need `jobs * service_s /
    target_wait_s` slots (never more than one per job), in workers of `slots_per_worker`.
    Nothing waiting or running: 0. No service time measured yet: enough workers for
    what runs, and at least 1 (its first jobs measure it). At most `max_workers`."""
    jobs = waiting + running
    if jobs <= 0:
        return 0
    if service_s is None:
        slots = running
    else:
        slots = min(jobs, math.ceil(jobs * service_s / target_wait_s - EPSILON))
    workers = math.ceil(slots / max(1, slots_per_worker) - EPSILON)
    return min(max_workers, max(1, workers))


def configured_slots(config: PipelineConfig) -> int:
    """What a worker of the pipeline will run at once (an LLM worker: `max_inflight`)."""
    if config.kind == "llm":
        try:
            return config.options_as(LlmOptions).max_inflight
        except ValidationError:
            return config.concurrency
    return config.concurrency


def waiting_of(snap: Snapshot) -> Counter[tuple[str, str]]:
    """The jobs waiting in `snap` by (pipeline, priority): messages in its Celery lists,
    and jobs held by fair share."""
    waiting: Counter[tuple[str, str]] = Counter()
    for (pipeline, _kind, priority), n in snap.depth.items():
        waiting[(pipeline, priority)] += n
    for field, n in snap.held.items():
        pipeline, _, priority = field.partition("|")
        waiting[(pipeline, priority)] += max(0, n)
    return waiting


def signals(snap: Snapshot, settings: Settings) -> list[PipelineSignals]:
    """Each enabled pipeline's signals in `snap`."""
    stale_s = settings.lease.heartbeat_s * STALE_HEARTBEATS
    waits = waiting_of(snap)
    out = []
    for name, config in sorted(settings.enabled_pipelines.items()):
        waiting = sum(n for (pipeline, _), n in waits.items() if pipeline == name)
        live = [
            info
            for info, age_s in snap.workers
            if info.get("pipeline") == name and age_s <= stale_s
        ]
        slots = configured_slots(config)
        slots_live = sum(int(info.get("slots") or slots) for info in live)
        per_worker = round(slots_live / len(live)) if live else slots
        running = sum(int(info.get("in_flight") or 0) for info in live)
        reading = snap.pipelines.get(name, PipelineReading())
        oldest = reading.oldest_queued_at
        auto = settings.autoscale
        out.append(
            PipelineSignals(
                pipeline=name,
                waiting=waiting,
                oldest_wait_s=0.0 if oldest is None or not waiting else max(0.0, snap.at - oldest),
                running=running,
                workers_live=len(live),
                slots_live=slots_live,
                slots_per_worker=per_worker,
                service_s=reading.service_s,
                desired=desired_workers(
                    waiting, running, reading.service_s, per_worker,
                    auto.target_wait_s, auto.max_workers,
                ),
            )
        )  # fmt: skip
    return out


GAUGES = {
    "waiting": (
        "mmq_pipeline_jobs_waiting",
        "Jobs waiting for a worker of the pipeline: in its queue (every priority) and held "
        "by fair share.",
    ),
    "oldest_wait_s": (
        "mmq_pipeline_oldest_wait_seconds",
        "How long the pipeline's oldest waiting job has waited (0: none waits).",
    ),
    "running": (
        "mmq_pipeline_jobs_running",
        "Jobs the pipeline's live workers run now (as their last heartbeats say).",
    ),
    "slots_live": (
        "mmq_pipeline_slots_live",
        "Jobs the pipeline's live workers may run at once (their concurrency, or an LLM "
        "worker's max_inflight).",
    ),
    "desired": (
        "mmq_pipeline_desired_workers",
        "Workers that would run the pipeline's waiting and running jobs within "
        "autoscale.target_wait_s at its measured service time (0: nothing to do).",
    ),
}


def families(snap: Snapshot, settings: Settings) -> Iterator[Metric]:
    rows = signals(snap, settings)
    for attr, (name, doc) in GAUGES.items():
        family = GaugeMetricFamily(name, doc, labels=["pipeline"])
        for row in rows:
            family.add_metric([row.pipeline], float(getattr(row, attr)))
        yield family
    service = GaugeMetricFamily(
        "mmq_pipeline_service_seconds",
        "Mean run time (start to end) of the pipeline's jobs that succeeded or failed in the "
        "last 5 minutes: the service time of mmq_pipeline_desired_workers.",
        labels=["pipeline"],
    )
    for row in rows:
        if row.service_s is not None:
            service.add_metric([row.pipeline], row.service_s)
    yield service
