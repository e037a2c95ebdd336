"""The response cache, as the API uses it: a deterministic request answered before gets
the stored answer at submit, as a job that ends at once without reaching a worker.

Workers write the cache and the API reads it, both through the job store
(`remember_answer`, `cached_answer`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
from typing import Any

from jobs.codec import dumps, job_from_fields
from jobs.models import EventType, Job
from jobs.schemas.base import JobInput
from jobs.settings import Settings
from jobs.states import JobStatus
from jobs.store import ALL_FIELDS, AsyncJobStore, Lease, transition

LEASE_TTL_MS = 30_000
"""The lease under which a cached answer ends its job (two script calls, not a run)."""


class ResponseCache:
    def __init__(self, settings: Settings, store: AsyncJobStore) -> None:
        self.settings = settings
        self.store = store

    async def lookup(self, owner: str, pipeline: str, request: JobInput) -> dict[str, Any] | None:
        """The cached answer to a deterministic request, if there is one."""
        policy = request.cache_policy(self.settings.pipelines[pipeline])
        if policy is None:
            return None
        answer = await self.store.cached_answer(owner, policy)
        return None if answer is None else {**answer, "cached": True}

    async def answer(self, job: Job, output: dict[str, Any]) -> Job | None:
        """End a new job with a cached answer, through the usual transitions (it runs
        here, under a lease of its own, instead of on a worker); None where something
        else moved the job first (a cancel), so the caller reads it as it is."""
        lease = Lease(token=f"response-cache:{secrets.token_hex(8)}", ttl_ms=LEASE_TTL_MS)
        started = await self.store.apply(
            transition(
                job,
                JobStatus.RUNNING,
                sources=frozenset({JobStatus.QUEUED}),
                lease_mode="acquire",
                lease=lease,
                fields={"started_at": repr(time.time()), "worker": "response-cache"},
            )
        )
        if not started.ok:
            return None
        end = transition(
            job,
            JobStatus.SUCCEEDED,
            sources=frozenset({JobStatus.RUNNING}),
            lease_mode="check",
            lease=lease,
            fields={"output": dumps(output), "finished_at": repr(time.time())},
            pre_event=(EventType.OUTPUT, output),
        )
        ended = await self.store.apply(replace(end, read_back=ALL_FIELDS))
        return job_from_fields(ended.read_back) if ended.ok else None
