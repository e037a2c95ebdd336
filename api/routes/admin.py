"""Admin routes, for the web console: the deployment's overview (JSON, or SSE that pushes
a fresh one every few seconds) and every owner's jobs. An admin key only (403 for
another key; with auth off the anonymous caller is an admin)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from api.auth import Admin, Keys
from api.deps import Service, SettingsDep, get_overview
from api.key_watch import while_key_lives
from api.overview import Overview, OverviewReader
from api.routes.events import SSE_REVOKED
from api.routes.jobs import Filter, Limit
from api.views import JobList, JobView, job_view
from jobstore.quotas import KeyLimits, Quota

router = APIRouter(
    prefix="/v1/admin",
    tags=["admin"],
    responses={
        401: {"description": "Missing or unknown API key (auth required)."},
        403: {"description": "The key is not an admin key."},
    },
)

STREAM_MAX_S = 600.0
"""An overview stream ends after this; an EventSource reconnects on its own."""
RECONNECT_MS = 1000

Reader = Annotated[OverviewReader, Depends(get_overview)]
Minutes = Annotated[
    int,
    Query(ge=1, le=14, description="Rates and percentiles over this many full minutes, plus "
          "the current one."),
]  # fmt: skip


@router.get("/overview", response_model=Overview)
async def overview(caller: Admin, reader: Reader, minutes: Minutes = 5) -> Overview:
    """Queues, running jobs, rates, latency and 429s per pipeline; workers; GPUs."""
    return await reader.read(minutes)


@router.get(
    "/overview/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`event: overview` frames; each `data` is an `Overview` as JSON.",
        }
    },
)
async def overview_stream(
    caller: Admin,
    request: Request,
    reader: Reader,
    api_keys: Keys,
    minutes: Minutes = 5,
    interval_s: Annotated[float, Query(ge=0.5, le=60)] = 2.0,
) -> StreamingResponse:
    """Server-Sent Events: a fresh overview (the JSON of `GET /v1/admin/overview`) every
    `interval_s` seconds, until the client goes or 10 minutes pass (then the page's
    EventSource reconnects by itself)."""
    frames = _frames(request, reader, minutes, interval_s)
    return StreamingResponse(
        while_key_lives(api_keys.watch, caller.key_id, frames, SSE_REVOKED),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _frames(
    request: Request, reader: OverviewReader, minutes: int, interval_s: float
) -> AsyncIterator[str]:
    yield f"retry: {RECONNECT_MS}\n\n"
    deadline = time.monotonic() + STREAM_MAX_S
    while time.monotonic() < deadline and not await request.is_disconnected():
        snapshot = await reader.read(minutes)
        yield f"event: overview\ndata: {snapshot.model_dump_json()}\n\n"
        await asyncio.sleep(interval_s)


@router.get("/jobs", response_model=JobList)
async def list_all_jobs(
    caller: Admin,
    service: Service,
    settings: SettingsDep,
    keep: Filter,
    owner: Annotated[str | None, Query(description="Only this owner's jobs.")] = None,
    limit: Limit = 50,
    cursor: str | None = None,
) -> JobList:
    """Every owner's jobs (or one owner's), newest first, with the filters of
    `GET /v1/jobs`; follow `next_cursor` for the next page."""
    if owner is not None:
        jobs, next_cursor = await service.list(owner, keep, limit=limit, cursor=cursor)
    else:
        jobs, next_cursor = await service.list_all(keep, limit=limit, cursor=cursor)
    base = settings.public_url
    return JobList(data=[job_view(j, base) for j in jobs], next_cursor=next_cursor)


@router.get("/jobs/{job_id}", response_model=JobView, responses={404: {}})
async def get_any_job(
    caller: Admin, job_id: str, service: Service, settings: SettingsDep
) -> JobView:
    """Any owner's job: with its worker and batch mates (`worker`, `batch`)."""
    return job_view(await service.get_any(job_id), settings.public_url)


@router.get("/limits/{owner}", response_model=Quota)
async def get_limits(caller: Admin, owner: str, service: Service) -> Quota:
    """A key's limits in effect (its own, else the deployment's) and what it uses now."""
    return await service.quota(owner)


@router.put("/limits/{owner}", response_model=Quota, responses={404: {}, 422: {}})
async def put_limits(
    caller: Admin, owner: str, body: KeyLimits, service: Service, api_keys: Keys
) -> Quota:
    """Set a key's own limits (`null`: the deployment's default); the next submit sees
    them. `mmq keys limits NAME` does the same. The owner must name a key (404 else)."""
    await api_keys.check_owner(owner)
    return await service.set_limits(owner, body)
