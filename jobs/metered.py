"""Job stores that also count: every accepted submit (in the script that stores the job),
and every transition that ends a job (wherever it happens: a worker, the reaper, a cancel
or a cached answer in the API).

A transition to a terminal status succeeds once per job (the script checks the current
status), so each end is counted once. The script that ends the job returns the fields its
metrics need (`Transition.read_back`). In workers and the reaper the samples are added to
the process's `MetricsTally` (written once per `metrics_flush_s`: no round trip per job);
in the API they go to Redis in one pipelined round trip. Metrics never fail a job: a
Redis error while counting is logged.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import redis

from jobs import keys
from jobs.metrics import END_FIELDS, JOBS_SUBMITTED, Sample, end_samples, field_of, queue
from jobs.models import Job
from jobs.settings import Settings
from jobs.store import (
    ALL_FIELDS,
    AsyncJobStore,
    EventListener,
    JobStore,
    Transition,
    TransitionResult,
)
from jobs.tally import MetricsTally

log = logging.getLogger(__name__)


class MeteredJobStore(JobStore):
    """`JobStore` for workers and the reaper; its owner starts and stops `tally`."""

    def __init__(
        self, client: redis.Redis, settings: Settings, on_event: EventListener | None = None
    ) -> None:
        super().__init__(client, settings, on_event)
        self.tally = MetricsTally(client, settings.metrics_flush_s)

    def apply(self, change: Transition) -> TransitionResult:
        result = super().apply(_reading_end_fields(change))
        self.tally.add(_end_samples(change, result))
        return result


class MeteredAsyncJobStore(AsyncJobStore):
    """`AsyncJobStore` for the API."""

    def submit_counter(self, job: Job) -> tuple[str, str]:
        """Counted in the same script that stores the job."""
        return keys.metric(JOBS_SUBMITTED.name), field_of((job.kind,))

    async def apply(self, change: Transition) -> TransitionResult:
        result = await super().apply(_reading_end_fields(change))
        samples = _end_samples(change, result)
        if samples:
            try:
                pipe = self.r.pipeline(transaction=False)
                queue(pipe, samples)
                await pipe.execute()
            except redis.RedisError as exc:
                log.warning("job %s: end not counted in metrics: %s", change.job_id, exc)
        return result


def _reading_end_fields(change: Transition) -> Transition:
    """`change`, returning the fields its end metrics need when it ends the job (all of
    them, where the caller asked for all)."""
    if not change.target.terminal or change.read_back == ALL_FIELDS:
        return change
    return replace(change, read_back=END_FIELDS)


def _end_samples(change: Transition, result: TransitionResult) -> list[Sample]:
    if not (result.ok and change.target.terminal):
        return []
    return end_samples({name: value or None for name, value in result.read_back.items()})
