"""Jobs of an index (an owner's, or every owner's for admins), newest first, a page at a
time, behind an opaque cursor."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs.errors import InputError
from jobs.models import Job
from jobs.states import JobStatus
from jobstore.store import AsyncJobStore

MAX_SCANNED_PER_ITEM = 20
"""A filtered page stops after this many jobs per item asked for (plus 100), so a rare
filter never reads an owner's whole history in one request."""


@dataclass(frozen=True)
class JobFilter:
    """What a listing keeps; `since` and `until` bound the creation time (unix seconds,
    both inclusive) and are applied in Redis, the rest to each job read."""

    status: JobStatus | None = None
    kind: str | None = None
    pipeline: str | None = None
    since: float | None = None
    until: float | None = None
    batch: str | None = None
    """The jobs of a batch's lines (`metadata.batch_id`)."""

    def matches(self, job: Job) -> bool:
        return (
            (self.status is None or job.status == self.status)
            and (self.kind is None or job.kind == self.kind)
            and (self.pipeline is None or job.pipeline == self.pipeline)
            and (self.batch is None or job.metadata.get("batch_id") == self.batch)
        )


def unix_seconds(when: datetime | None) -> float | None:
    """A query's time as unix seconds; one without a zone is UTC."""
    if when is None:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


async def list_jobs(
    store: AsyncJobStore,
    index: str,
    keep: JobFilter,
    *,
    limit: int,
    cursor: str | None,
) -> tuple[list[Job], str | None]:
    """The jobs of `index` (`keys.owner_jobs`, `keys.ALL_JOBS`), newest first, that `keep`
    matches; returns (page, next cursor)."""
    if cursor:
        max_score, after_id = decode_cursor(cursor)
    else:
        # The API shows times to the microsecond: `until` a job's `created_at` keeps it.
        max_score = "+inf" if keep.until is None else repr(keep.until + 1e-6)
        after_id = None
    min_score = "-inf" if keep.since is None else repr(keep.since)
    page: list[Job] = []
    scanned = 0
    while len(page) < limit and scanned < MAX_SCANNED_PER_ITEM * limit + 100:
        rows = await store.list_ids(index, max_score, min_score, limit + 50)
        if after_id is not None:
            rows = [r for r in rows if not (r[1] == float(max_score) and r[0] >= after_id)]
        if not rows:
            return page, None
        jobs = await store.get_many([job_id for job_id, _ in rows])
        # Jobs that expired leave their id in the index: drop those ids now.
        await store.forget(index, [r[0] for r, j in zip(rows, jobs, strict=True) if j is None])
        for (job_id, score), job in zip(rows, jobs, strict=True):
            scanned += 1
            max_score, after_id = repr(score), job_id
            if job is None or not keep.matches(job):
                continue
            page.append(job)
            if len(page) == limit:
                return page, encode_cursor(score, job_id)
    return page, (encode_cursor(float(max_score), after_id) if after_id else None)


def encode_cursor(score: float, job_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([score, job_id]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        score, job_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return repr(float(score)), str(job_id)
    except (ValueError, TypeError) as exc:
        raise InputError("cursor", "is not a cursor this API returned") from exc
