"""The metrics that every process counts, so that one scrape of the API's `/metrics` sees
the whole deployment (`api/prometheus.py` renders them for Prometheus): their
definitions, and the samples of a job's end and of a batch.

A sample is (metric, label values, value). Where they are kept, and how they are added
up, is the store's (`jobstore/metric_counts.py`); a field of a kept metric is
`field_of` its label values (and a histogram's bucket, `bucket_of`, or `"sum"`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

from jobs.models import timings_of
from jobs.states import JobStatus


@dataclass(frozen=True)
class MetricDef:
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    """Upper bounds of a histogram's buckets (+Inf implied); empty for a counter."""

    @property
    def histogram(self) -> bool:
        return bool(self.buckets)


SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
           300.0, 900.0)  # fmt: skip
TOKEN_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
BATCH_SIZES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
JOB_LABELS = ("kind", "pipeline")

JOBS_SUBMITTED = MetricDef("mmq_jobs_submitted", "Jobs accepted (202), by kind.", ("kind",))
JOBS_FINISHED = MetricDef(
    "mmq_jobs_finished",
    "Jobs that ended, by kind and status (succeeded, failed, canceled).",
    ("kind", "status"),
)
QUEUE_WAIT = MetricDef(
    "mmq_job_queue_wait_seconds",
    "From submit (or requeue) to the start of the run, of every job that started.",
    JOB_LABELS,
    SECONDS,
)
FIRST_OUTPUT = MetricDef(
    "mmq_job_time_to_first_output_seconds",
    "From submit to the first partial output or progress event, of succeeded jobs.",
    JOB_LABELS,
    SECONDS,
)
TPOT = MetricDef(
    "mmq_job_time_per_output_token_seconds",
    "LLM: time per output token after the first, of succeeded jobs.",
    JOB_LABELS,
    TOKEN_SECONDS,
)
END_TO_END = MetricDef(
    "mmq_job_end_to_end_seconds",
    "From submit to the end, of succeeded jobs.",
    JOB_LABELS,
    SECONDS,
)
BATCH_SIZE = MetricDef(
    "mmq_batch_size", "Requests in each batch a pipeline ran.", ("pipeline",), BATCH_SIZES
)
BATCH_SECONDS = MetricDef(
    "mmq_batch_duration_seconds", "Time a pipeline took to run one batch.", ("pipeline",), SECONDS
)

JOBS_REJECTED = MetricDef(
    "mmq_jobs_rejected",
    "Submits refused with 429 because the kind's queue was full, by kind and pipeline.",
    JOB_LABELS,
)

MESSAGES_RESENT = MetricDef(
    "mmq_messages_resent",
    "Task messages the reaper sent again for queued jobs: `stranded` (taken by a worker "
    "that died before starting the job) or `missing` (none anywhere).",
    ("reason",),
)

BATCH_LINES_PREEMPTED = MetricDef(
    "mmq_batch_lines_preempted",
    "Running batch lines stopped for interactive work (`batches.preempt`), by pipeline: "
    "each throws away what the line had done.",
    ("pipeline",),
)

MODEL_LOADS = MetricDef(
    "mmq_model_loads",
    "On-demand models loaded when a job came, by pipeline and device.",
    ("pipeline", "device"),
)
MODEL_LOAD_SECONDS = MetricDef(
    "mmq_model_load_seconds",
    "Time an on-demand model took to load (and warm up), by pipeline.",
    ("pipeline",),
    SECONDS,
)
MODEL_UNLOADS = MetricDef(
    "mmq_model_unloads",
    "On-demand models unloaded, by pipeline, device and reason: `idle` (no work for "
    "idle_unload_s) or `evicted` (another model of the device needed its room).",
    ("pipeline", "device", "reason"),
)

VOICE_SECONDS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
VOICE_TURN_STAGES = MetricDef(
    "mmq_realtime_turn_stage_seconds",
    "Voice turns of `/v1/realtime`, from the end of speech to the first audio, by stage "
    "(`vad_tail`, `transcript`, `llm_first_token`, `first_sentence`, `tts_first_chunk`, "
    "and `total`): each stage from the end of the one before it.",
    ("stage",),
    VOICE_SECONDS,
)

RECORDED = (
    JOBS_SUBMITTED, JOBS_FINISHED, QUEUE_WAIT, FIRST_OUTPUT, TPOT, END_TO_END, BATCH_SIZE,
    BATCH_SECONDS, MESSAGES_RESENT, JOBS_REJECTED, MODEL_LOADS, MODEL_LOAD_SECONDS,
    MODEL_UNLOADS, BATCH_LINES_PREEMPTED, VOICE_TURN_STAGES,
)  # fmt: skip
"""Every metric kept in Redis (the API adds gauges it reads at scrape time)."""

END_FIELDS = (
    "kind", "pipeline", "status", "created_at", "queued_at", "started_at", "first_output_at",
    "finished_at", "extra_timings",
)  # fmt: skip
"""The job fields that its end metrics need (read back by the script that ends the job;
never the input or output)."""

Sample = tuple[MetricDef, tuple[str, ...], float]


@functools.lru_cache(maxsize=4096)  # label values are few (kinds, pipelines, statuses)
def field_of(labels: tuple[str, ...], suffix: str | None = None) -> str:
    values = [*labels, suffix] if suffix is not None else list(labels)
    return json.dumps(values, separators=(",", ":"))


def bucket_of(metric: MetricDef, value: float) -> str:
    for bound in metric.buckets:
        if value <= bound:
            return repr(bound)
    return "+Inf"


def end_samples(fields: Mapping[str, str | None]) -> list[Sample]:
    """The samples of a job that has just ended, from its END_FIELDS."""
    status = JobStatus(fields["status"] or "")
    if not status.terminal:
        return []
    kind, pipeline = fields["kind"] or "", fields["pipeline"] or ""
    created, queued, started, first_output, finished = (
        _float(fields.get(name)) for name in END_FIELDS[3:8]
    )
    timings = timings_of(
        created or 0.0,
        queued or 0.0,
        started,
        first_output,
        finished,
        json.loads(fields.get("extra_timings") or "{}"),
    )
    samples: list[Sample] = [(JOBS_FINISHED, (kind, str(status)), 1)]
    labels = (kind, pipeline)
    values = [(QUEUE_WAIT, timings.queue_wait_ms)]
    if status is JobStatus.SUCCEEDED:
        values += [
            (FIRST_OUTPUT, timings.time_to_first_output_ms),
            (TPOT, timings.tpot_ms),
            (END_TO_END, timings.total_ms),
        ]
    samples += [(metric, labels, ms / 1000.0) for metric, ms in values if ms is not None]
    return samples


def turn_samples(stages: Mapping[str, float]) -> list[Sample]:
    """The samples of a voice turn's stage times (`realtime.timing.TurnTimes.stages`)."""
    return [(VOICE_TURN_STAGES, (stage,), seconds) for stage, seconds in stages.items()]


def batch_samples(pipeline: str, size: int, seconds: float) -> list[Sample]:
    return [(BATCH_SIZE, (pipeline,), float(size)), (BATCH_SECONDS, (pipeline,), seconds)]


def _float(value: str | None) -> float | None:
    return float(value) if value else None
