"""An owner's jobs, newest first, a page at a time, behind an opaque cursor."""

from __future__ import annotations

import base64
import json

from jobs.errors import InputError
from jobs.models import Job
from jobs.states import JobStatus
from jobs.store import AsyncJobStore

MAX_SCANNED_PER_ITEM = 20
"""A filtered page stops after this many jobs per item asked for (plus 100), so a rare
filter never reads an owner's whole history in one request."""


async def list_jobs(
    store: AsyncJobStore,
    owner: str,
    *,
    status: JobStatus | None,
    kind: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Job], str | None]:
    """The owner's jobs, newest first, filtered; returns (page, next cursor)."""
    max_score, after_id = decode_cursor(cursor) if cursor else ("+inf", None)
    page: list[Job] = []
    scanned = 0
    while len(page) < limit and scanned < MAX_SCANNED_PER_ITEM * limit + 100:
        rows = await store.list_ids(owner, max_score, limit + 50)
        if after_id is not None:
            rows = [r for r in rows if not (r[1] == float(max_score) and r[0] >= after_id)]
        if not rows:
            return page, None
        jobs = await store.get_many([job_id for job_id, _ in rows])
        # Jobs that expired leave their id in the owner's index: drop those ids now.
        await store.forget(owner, [r[0] for r, j in zip(rows, jobs, strict=True) if j is None])
        for (job_id, score), job in zip(rows, jobs, strict=True):
            scanned += 1
            max_score, after_id = repr(score), job_id
            if job is None or (status and job.status != status) or (kind and job.kind != kind):
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
