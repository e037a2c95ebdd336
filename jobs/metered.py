"""Job stores that also count: every accepted submit (in the script that stores the job),
and every transition that ends a job (wherever it happens: a worker, the reaper, a cancel
or a cached answer in the API).

A transition to a terminal status succeeds once per job (the script checks the current
status), so each end is counted once. The script that ends the job returns the fields its
metrics need (`Transition.read_back`). In workers and the reaper the samples are added to
the process's `MetricsTally` (written once per `metrics_flush_s`: no round trip per job);
in the API they go to Redis in one pipelined round trip. The same writes add to the
overview's per-minute counts (`jobs/recent.py`). A submit refused with 429 is counted in
the API (one round trip, on that path alone). Metrics never fail a job: a Redis error
while counting is logged.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import redis

from jobs import keys, recent
from jobs.changes import ALL_FIELDS, SubmitResult, Transition, TransitionResult
from jobs.kombu_redis import TaskMessage
from jobs.metrics import (
    END_FIELDS,
    JOBS_REJECTED,
    JOBS_SUBMITTED,
    Sample,
    end_samples,
    field_of,
    queue,
)
from jobs.models import Job
from jobs.settings import Settings
from jobs.store import AsyncJobStore, EventListener, JobStore
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
        samples = _end_samples(change, result)
        if samples:
            self.tally.add(samples)
            self.tally.count(recent.end_cells(result.read_back, samples), recent.KEEP_S)
        return result


class MeteredAsyncJobStore(AsyncJobStore):
    """`AsyncJobStore` for the API."""

    def submit_counter(self, job: Job) -> tuple[str, str]:
        """Counted in the same script that stores the job."""
        return keys.metric(JOBS_SUBMITTED.name), field_of((job.kind,))

    async def submit(
        self,
        job: Job,
        *,
        max_queued: int,
        idempotency: tuple[str, str] | None,
        message: TaskMessage | None = None,
        cost: int = 0,
    ) -> SubmitResult:
        """Also counts a submit refused with 429 (one round trip, on that path alone)."""
        result = await super().submit(
            job, max_queued=max_queued, idempotency=idempotency, message=message, cost=cost
        )
        if result.outcome == "full":
            labels = (job.kind, job.pipeline)
            await self._count(
                [(JOBS_REJECTED, labels, 1)],
                [recent.rejected_cell(*labels, now=job.created_at)],
                job.id,
            )
        return result

    async def apply(self, change: Transition) -> TransitionResult:
        result = await super().apply(_reading_end_fields(change))
        samples = _end_samples(change, result)
        if samples:
            cells = recent.end_cells(result.read_back, samples)
            await self._count(samples, cells, change.job_id)
        return result

    async def _count(self, samples: list[Sample], cells: list[recent.Cell], job_id: str) -> None:
        """The counters and the overview's per-minute counts, in one round trip."""
        try:
            pipe = self.r.pipeline(transaction=False)
            queue(pipe, samples)
            for key, name, amount in cells:
                pipe.hincrby(key, name, amount)
            for key in {key for key, _, _ in cells}:
                pipe.expire(key, recent.KEEP_S)
            await pipe.execute()
        except redis.RedisError as exc:
            log.warning("job %s: not counted in metrics: %s", job_id, exc)


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
