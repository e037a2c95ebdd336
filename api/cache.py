"""The response cache, as the API uses it: a deterministic request answered before gets
the stored answer at submit, as a job that ends at once without reaching a worker.

Workers write the cache and the API reads it, both through the job store
(`remember_answer`, `cached_answer`).
"""

from __future__ import annotations

from pydantic import JsonValue

from jobs.models import Job
from jobs.schemas.base import JobInput
from jobs.settings import Settings
from jobstore import operations
from jobstore.codec import job_from_fields
from jobstore.store import AsyncJobStore


class ResponseCache:
    def __init__(self, settings: Settings, store: AsyncJobStore) -> None:
        self.settings = settings
        self.store = store

    async def lookup(
        self, owner: str, pipeline: str, request: JobInput
    ) -> dict[str, JsonValue] | None:
        """The cached answer to a deterministic request (a job's output, its kind's JSON),
        if there is one."""
        policy = request.cache_policy(self.settings.pipelines[pipeline])
        if policy is None:
            return None
        answer = await self.store.cached_answer(owner, policy)
        return None if answer is None else {**answer, "cached": True}

    async def answer(self, job: Job, output: dict[str, JsonValue]) -> Job | None:
        """End a new job with a cached answer, through the usual transitions (it runs
        here, under a lease of its own, instead of on a worker); None where something
        else moved the job first (a cancel), so the caller reads it as it is."""
        start, end = operations.answer_from_cache(job, output)
        if not (await self.store.apply(start)).ok:
            return None
        ended = await self.store.apply(end)
        return job_from_fields(ended.read_back) if ended.ok else None
