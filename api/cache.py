"""The response cache, as the API uses it: a deterministic request answered before gets
the stored answer at submit, as a job that ends at once without reaching a worker.

Workers write the cache (`keys.response_cache`); the API only reads it. The read lives
here, not in `jobs/store.py`, until the store grows a method for it (issue 17).
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import replace
from typing import Any

import redis.asyncio as aredis

from jobs import keys
from jobs.codec import dumps, job_from_fields
from jobs.models import EventType, Job
from jobs.schemas.base import JobInput
from jobs.settings import Settings
from jobs.states import JobStatus
from jobs.store import ALL_FIELDS, AsyncJobStore, Lease, transition

LEASE_TTL_MS = 30_000
"""The lease under which a cached answer ends its job (two script calls, not a run)."""


class ResponseCache:
    def __init__(self, settings: Settings, store: AsyncJobStore, client: aredis.Redis) -> None:
        self.settings = settings
        self.store = store
        self.r = client

    async def lookup(self, owner: str, pipeline: str, request: JobInput) -> dict[str, Any] | None:
        """The cached answer to a deterministic request, if there is one."""
        policy = request.cache_policy(self.settings.pipelines[pipeline])
        if policy is None:
            return None
        raw = await self.r.get(keys.response_cache(owner, policy.digest))
        return None if raw is None else {**json.loads(raw), "cached": True}

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
