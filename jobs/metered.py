"""Job stores that also count: every accepted submit (in the script that stores the job),
and every transition that ends a job (wherever it happens: a worker, the reaper, a cancel
or a cached answer in the API).

A transition to a terminal status succeeds once per job (the script checks the current
status), so each end is counted once. The end's timings come from one HMGET of the
job's timing fields, and its samples go to Redis in one pipelined round trip. Metrics
never fail a job: a Redis error while counting is logged and dropped.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from jobs import keys
from jobs.metrics import END_FIELDS, JOBS_SUBMITTED, end_samples, field_of, queue
from jobs.models import Job
from jobs.queues import TaskMessage
from jobs.store import AsyncJobStore, JobStore, SubmitResult, Transition, TransitionResult

log = logging.getLogger(__name__)


class MeteredJobStore(JobStore):
    """`JobStore` for workers and the reaper."""

    def apply(self, change: Transition) -> TransitionResult:
        result = super().apply(change)
        if result.ok and change.target.terminal:
            try:
                self._count_end(change.job_id)
            except redis.RedisError as exc:
                log.warning("job %s: end not counted in metrics: %s", change.job_id, exc)
        return result

    def _count_end(self, job_id: str) -> None:
        values = self.r.hmget(keys.job(job_id), list(END_FIELDS))
        if values[0] is None:
            return
        pipe = self.r.pipeline(transaction=False)
        queue(pipe, end_samples(_fields(values)))
        pipe.execute()


class MeteredAsyncJobStore(AsyncJobStore):
    """`AsyncJobStore` for the API."""

    async def submit(
        self,
        job: Job,
        *,
        max_queued: int,
        idempotency: tuple[str, str] | None,
        message: TaskMessage | None = None,
        counter: tuple[str, str] | None = None,
    ) -> SubmitResult:
        """Counts the submit in the same script that stores the job."""
        submitted = (keys.metric(JOBS_SUBMITTED.name), field_of((job.kind,)))
        return await super().submit(
            job, max_queued=max_queued, idempotency=idempotency, message=message,
            counter=counter or submitted,
        )  # fmt: skip

    async def apply(self, change: Transition) -> TransitionResult:
        result = await super().apply(change)
        if result.ok and change.target.terminal:
            try:
                await self._count_end(change.job_id)
            except redis.RedisError as exc:
                log.warning("job %s: end not counted in metrics: %s", change.job_id, exc)
        return result

    async def _count_end(self, job_id: str) -> None:
        values = await self.r.hmget(keys.job(job_id), list(END_FIELDS))
        if values[0] is None:
            return
        pipe = self.r.pipeline(transaction=False)
        queue(pipe, end_samples(_fields(values)))
        await pipe.execute()


def _fields(values: list[Any]) -> dict[str, str | None]:
    """HMGET's answer (END_FIELDS, in order) as a dict; clients decode responses."""
    return {name: None if v is None else str(v) for name, v in zip(END_FIELDS, values, strict=True)}
