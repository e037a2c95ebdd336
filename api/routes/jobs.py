"""Job routes: submit, get, list, cancel, with `Prefer: wait=N` and `Idempotency-Key`."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response

from api.auth import JobOwner, Owner
from api.deps import Service, SettingsDep
from api.listing import JobFilter, unix_seconds
from api.service import JobService
from api.views import JobList, JobView, job_view
from jobs.models import Job, JobCreate
from jobs.settings import Settings
from jobs.states import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)")

Prefer = Annotated[
    str | None,
    Header(
        alias="Prefer",
        description="`wait=N`: answer 200 once the job has ended, or 202 after N seconds.",
    ),
]
IDEMPOTENCY_KEY_MAX = 255
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=IDEMPOTENCY_KEY_MAX,
        description="A repeated submit with the same key returns the same job.",
    ),
]


def prefer_wait(prefer: str | None) -> float | None:
    """Seconds of `Prefer: wait=N`, or None."""
    if not prefer:
        return None
    match = _WAIT.search(prefer)
    return float(match.group(1)) if match else None


def _answer(settings: Settings, job: Job, waited: float | None, pending_202: bool) -> Response:
    """200 with the job; 202 instead while it has not ended, where `pending_202`."""
    view = job_view(job, settings.public_url)
    status = 202 if pending_202 and not job.status.terminal else 200
    headers = {"Location": view.urls.self}
    if waited is not None:
        headers["Preference-Applied"] = f"wait={waited:g}"
    return Response(
        view.model_dump_json(), status_code=status, headers=headers, media_type="application/json"
    )


# `owner` comes first in each signature: FastAPI solves dependencies before it validates
# the body, so a caller without a valid key gets 401 whatever it sent.


@router.post(
    "",
    status_code=202,
    response_model=JobView,
    responses={200: {"model": JobView}, 413: {}, 422: {}, 429: {}},
)
async def submit_job(
    owner: Owner,
    body: JobCreate,
    service: Service,
    settings: SettingsDep,
    prefer: Prefer = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Submit a job. 202 at once; with `Prefer: wait=N`, 200 if it ends within N seconds."""
    return await submit(owner, body, service, settings, prefer, idempotency_key)


async def submit(
    owner: str,
    body: JobCreate,
    service: JobService,
    settings: Settings,
    prefer: str | None,
    idempotency_key: str | None,
) -> Response:
    """The answer to a submit (`submit_job`, and its plain route, `api.plain_routes`, which
    serves the requests)."""
    waited = prefer_wait(prefer)
    if waited is None:
        job, _created = await service.submit(owner, body, idempotency_key)
    else:
        job = await service.submit_and_wait(owner, body, idempotency_key, waited)
    return _answer(settings, job, waited, pending_202=True)


async def job_filter(
    status: JobStatus | None = None,
    kind: str | None = None,
    pipeline: Annotated[
        str | None, Query(description="The pipeline (`model`) that ran it.")
    ] = None,
    since: Annotated[
        datetime | None, Query(description="Created at or after (ISO 8601 or unix seconds).")
    ] = None,
    until: Annotated[
        datetime | None, Query(description="Created at or before (ISO 8601 or unix seconds).")
    ] = None,
    batch: Annotated[
        str | None, Query(max_length=64, description="The lines of this batch (its id).")
    ] = None,
) -> JobFilter:
    """The filters of a job listing (a time without a zone is UTC)."""
    return JobFilter(status, kind, pipeline, unix_seconds(since), unix_seconds(until), batch)


Filter = Annotated[JobFilter, Depends(job_filter)]
Limit = Annotated[int, Query(ge=1, le=200)]


@router.get("", response_model=JobList)
async def list_jobs(
    owner: Owner,
    service: Service,
    settings: SettingsDep,
    keep: Filter,
    limit: Limit = 50,
    cursor: str | None = None,
) -> JobList:
    """The caller's jobs, newest first; follow `next_cursor` for the next page."""
    jobs, next_cursor = await service.list(owner, keep, limit=limit, cursor=cursor)
    base = settings.public_url
    return JobList(data=[job_view(j, base) for j in jobs], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobView, responses={202: {"model": JobView}})
async def get_job(
    owner: JobOwner, job_id: str, service: Service, settings: SettingsDep, prefer: Prefer = None
) -> Response:
    """A job. With `Prefer: wait=N`: 200 once it has ended, 202 if N seconds pass first."""
    waited = prefer_wait(prefer)
    if waited is None:
        job = await service.get(owner, job_id)
    else:
        job = await service.wait(owner, job_id, waited)
    return _answer(settings, job, waited, pending_202=waited is not None)


@router.get("/{job_id}/deliveries")
async def job_deliveries(owner: JobOwner, job_id: str, service: Service) -> dict[str, object]:
    """Every webhook delivery attempt of the job: status code or error, timing, retry."""
    return {"data": await service.deliveries(owner, job_id)}


@router.post(
    "/{job_id}/retry",
    status_code=202,
    response_model=JobView,
    responses={404: {}, 409: {"description": "The job has not ended."}, 429: {}},
)
async def retry_job(
    owner: JobOwner, job_id: str, service: Service, settings: SettingsDep
) -> Response:
    """Run an ended job again: a new job of yours with its kind, input, priority, metadata
    and webhook, validated and routed as a new submit (so the same pipeline, unless the
    configuration changed). 202 with the new job; 409 while the job has not ended."""
    job = await service.retry(owner, job_id)
    return _answer(settings, job, None, pending_202=True)


@router.post("/{job_id}/cancel", response_model=JobView)
async def cancel_job(
    owner: JobOwner, job_id: str, service: Service, settings: SettingsDep
) -> Response:
    """Cancel a job: a queued job never runs; a running one stops at its next step."""
    job = await service.cancel(owner, job_id)
    return _answer(settings, job, None, pending_202=False)
