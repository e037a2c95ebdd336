"""Job records and their status events, read by id without the store's scripts or
settings: for tools beside the service that watch a deployment from outside (the
harness's accounting of jobs under faults, `tuning.deployment`, `harness.faults`; `mmq
record`, `tuning.record`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import cast

import redis

from jobs import keys
from jobs.models import Job
from jobstore.codec import job_from_fields, text_list, text_map


def _text(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


class JobLookup:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def get(self, job_id: str) -> Job | None:
        """The job, or None where its record is gone (never was, or expired)."""
        fields = text_map(self.r.hgetall(keys.job(job_id)))
        return job_from_fields(fields) if fields else None

    def statuses(self, job_ids: Sequence[str]) -> list[str]:
        """Each job's status, in order ("" where its record is gone); one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "status")
        return [_text(status) for status in pipe.execute()]

    def status_events(self, job_id: str) -> list[str]:
        """The statuses of the job's status events, in order, from its stream."""
        # A decoding client's reply (as every mmq client's: `jobstore.codec`).
        entries = cast(list[tuple[str, dict[str, str]]], self.r.xrange(keys.job_events(job_id)))
        return [json.loads(e["data"])["status"] for _, e in entries if e["type"] == "status"]

    def running(self) -> list[str]:
        """The ids of the jobs running now (each with a lease)."""
        return text_list(self.r.zrange(keys.RUNNING, 0, -1))

    def worker_of(self, job_id: str) -> str:
        """The worker its record names ("" for none)."""
        return _text(self.r.hget(keys.job(job_id), "worker"))

    def traceparent_of(self, job_id: str) -> str:
        """The trace context its record keeps ("" for none: tracing was off)."""
        return _text(self.r.hget(keys.job(job_id), "traceparent"))
