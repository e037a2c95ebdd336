"""Job routes: submit, get, list, cancel, with `Prefer: wait=N` and `Idempotency-Key`."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from api.auth import current_owner
from api.deps import get_service, get_state
from api.service import JobService
from api.views import JobList, JobView, job_view
from jobs.errors import InputError
from jobs.models import Job, JobCreate
from jobs.states import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

Owner = Annotated[str, Depends(current_owner)]
Service = Annotated[JobService, Depends(get_service)]
_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)")


def prefer_wait(prefer: str | None) -> float | None:
    """Seconds of `Prefer: wait=N`, or None."""
    if not prefer:
        return None
    match = _WAIT.search(prefer)
    return float(match.group(1)) if match else None


def _answer(request: Request, job: Job, waited: float | None, pending_202: bool) -> Response:
    """200 with the job; 202 instead while it has not ended, where `pending_202`."""
    settings = get_state(request).settings
    view = job_view(job, settings.public_url)
    status = 202 if pending_202 and not job.status.terminal else 200
    headers = {"Location": view.urls.self}
    if waited is not None:
        headers["Preference-Applied"] = f"wait={waited:g}"
    return Response(
        view.model_dump_json(), status_code=status, headers=headers, media_type="application/json"
    )


# The two hottest routes (submit and get) read the service and their headers themselves:
# each FastAPI dependency or header parameter cost ~50-75 us per request here (measured
# with empty routes: body only 0.57 ms, plus `Owner` and `Service` 0.72 ms), a tenth of
# a no-op job's whole path. `Owner` stays a dependency: FastAPI solves it before the body,
# so a caller without a valid key gets 401 whatever it sent. Headers are documented here.
PREFER = {
    "name": "Prefer",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "`wait=N`: answer 200 once the job has ended, or 202 after N seconds.",
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": 255},
    "description": "A repeated submit with the same key returns the same job.",
}


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > 255:
        raise InputError("Idempotency-Key", "is longer than 255 characters")
    return key


@router.post(
    "",
    status_code=202,
    response_model=JobView,
    responses={200: {"model": JobView}, 413: {}, 422: {}, 429: {}},
    openapi_extra={"parameters": [PREFER, IDEMPOTENCY_KEY]},
)
async def submit_job(request: Request, body: JobCreate, owner: Owner) -> Response:
    """Submit a job. 202 at once; with `Prefer: wait=N`, 200 if it ends within N seconds."""
    service = get_state(request).service
    idempotency_key = _idempotency_key(request)
    waited = prefer_wait(request.headers.get("prefer"))
    if waited is None:
        job, _created = await service.submit(owner, body, idempotency_key)
    else:
        job = await service.submit_and_wait(owner, body, idempotency_key, waited)
    return _answer(request, job, waited, pending_202=True)


@router.get("", response_model=JobList)
async def list_jobs(
    request: Request,
    owner: Owner,
    service: Service,
    status: JobStatus | None = None,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> JobList:
    """The caller's jobs, newest first; follow `next_cursor` for the next page."""
    jobs, next_cursor = await service.list(
        owner, status=status, kind=kind, limit=limit, cursor=cursor
    )
    base = get_state(request).settings.public_url
    return JobList(data=[job_view(j, base) for j in jobs], next_cursor=next_cursor)


@router.get(
    "/{job_id}",
    response_model=JobView,
    responses={202: {"model": JobView}},
    openapi_extra={"parameters": [PREFER]},
)
async def get_job(request: Request, job_id: str, owner: Owner) -> Response:
    """A job. With `Prefer: wait=N`: 200 once it has ended, 202 if N seconds pass first."""
    service = get_state(request).service
    waited = prefer_wait(request.headers.get("prefer"))
    if waited is None:
        job = await service.get(owner, job_id)
    else:
        job = await service.wait(owner, job_id, waited)
    return _answer(request, job, waited, pending_202=waited is not None)


@router.get("/{job_id}/deliveries")
async def job_deliveries(job_id: str, owner: Owner, service: Service) -> dict[str, object]:
    """Every webhook delivery attempt of the job: status code or error, timing, retry."""
    return {"data": await service.deliveries(owner, job_id)}


@router.post("/{job_id}/cancel", response_model=JobView)
async def cancel_job(request: Request, job_id: str, owner: Owner, service: Service) -> Response:
    """Cancel a job: a queued job never runs; a running one stops at its next step."""
    job = await service.cancel(owner, job_id)
    return _answer(request, job, None, pending_202=False)
