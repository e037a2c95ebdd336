"""What `/metrics` reads for each pipeline's autoscaling signals (`api/autoscale.py`),
beyond the deployment's snapshot (`jobstore.deployment_reader`, which has the queues'
lengths, the held counts and the workers' heartbeats):

- when its oldest waiting job was queued: the oldest `PEEK` messages of each of its
  Celery lists, and the first job of each key's hold lists (fair share keeps each key's
  jobs oldest first), with their jobs' status and `queued_at`; a job that has left
  `queued` (canceled, expired) while its message waits is passed over;
- the run time of its jobs that ended in the last minutes (`jobstore.recent_counts`:
  `run_ms` and `runs`), its measured service time.

At most three pipelined round trips, whatever the backlog: their commands count the
pipelines' lists and holds that have jobs, the keys holding jobs, and the minutes read,
never the jobs waiting.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis.asyncio as aredis

from broker.kombu_redis import job_id_of, priority_lists
from broker.queues import queue_name
from jobs import keys
from jobs.states import JobStatus
from jobstore.codec import text_list
from jobstore.recent_counts import Counts, add_up, minute_of
from jobstore.scheduling import INTERACTIVE

PEEK = 4
"""The oldest messages read of each Celery list: those of jobs canceled while queued stay
there until a worker drops them, and are passed over."""

WINDOW_MINUTES = 5
"""The run times averaged: the jobs that ended in the current minute and the 5 before."""


@dataclass
class PipelineReading:
    """One pipeline's reads for its autoscaling signals."""

    oldest_queued_at: float | None = None
    """When its oldest waiting job was queued (unix seconds); None: none waits."""
    run_ms: int = 0
    """The run time of its jobs that ended in the window, summed."""
    runs: int = 0
    """Those jobs."""

    @property
    def service_s(self) -> float | None:
        """The mean run time of its jobs that ended in the window; None for none."""
        return self.run_ms / self.runs / 1000 if self.runs else None


class PipelineSignalsReader:
    def __init__(self, client: aredis.Redis) -> None:
        self._r = client

    async def read(
        self, pipelines: Sequence[str], now: float, waiting: Mapping[tuple[str, str], int]
    ) -> dict[str, PipelineReading]:
        """Each of `pipelines`' oldest waiting job and recent run times, at `now`
        (Redis's clock). `waiting`: the jobs waiting by (pipeline, priority), in its
        Celery lists or held (the snapshot's), so that an empty list or hold costs no
        read."""
        lists = [
            key
            for name in pipelines
            for priority, key in priority_lists(queue_name(name)).items()
            if waiting.get((name, priority), 0) > 0
        ]
        holders = [
            (name, priority)
            for name in pipelines
            for priority in INTERACTIVE
            if waiting.get((name, priority), 0) > 0
        ]
        minute = minute_of(now)
        pipe = self._r.pipeline(transaction=False)
        for key in lists:
            pipe.lrange(key, -PEEK, -1)
        for name, priority in holders:
            pipe.zrange(keys.holders(name, priority), 0, -1)
        for m in range(minute - WINDOW_MINUTES, minute + 1):
            pipe.hgetall(keys.recent(m))
        found = await pipe.execute()
        messages, owners = found[: len(lists)], found[len(lists) : len(lists) + len(holders)]
        readings = {name: PipelineReading() for name in pipelines}
        _add_runs(readings, add_up(found[len(lists) + len(holders) :]))
        queued = [j for raws in messages for raw in raws if (j := job_id_of(json.loads(raw)))]
        heads = [
            keys.hold(name, priority, owner)
            for (name, priority), names in zip(holders, owners, strict=True)
            for owner in text_list(names)
        ]
        for status, queued_at, pipeline in await self._records(queued, heads):
            reading = readings.get(pipeline or "")
            if reading is None or status != JobStatus.QUEUED or not queued_at:
                continue
            at = float(queued_at)
            if reading.oldest_queued_at is None or at < reading.oldest_queued_at:
                reading.oldest_queued_at = at
        return readings

    async def _records(self, job_ids: list[str], holds: list[str]) -> list[list[str | None]]:
        """The status, `queued_at` and pipeline of `job_ids` and of the first job of each
        hold list of `holds`."""
        if not job_ids and not holds:
            return []
        pipe = self._r.pipeline(transaction=False)
        for key in holds:
            pipe.lindex(key, 0)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), FIELDS)
        found = await pipe.execute()
        held = [json.loads(raw)["job_id"] for raw in found[: len(holds)] if raw]
        records: list[list[str | None]] = found[len(holds) :]
        if held:
            pipe = self._r.pipeline(transaction=False)
            for job_id in held:
                pipe.hmget(keys.job(job_id), FIELDS)
            records += await pipe.execute()
        return records


FIELDS = ["status", "queued_at", "pipeline"]


def _add_runs(readings: dict[str, PipelineReading], counts: Counts) -> None:
    """The run times of `counts` (the window's minutes, summed) to their pipelines."""
    for key, n in counts.items():
        if len(key) != 3 or key[2] not in readings:
            continue
        if key[0] == "runs":
            readings[key[2]].runs += n
        elif key[0] == "run_ms":
            readings[key[2]].run_ms += n
