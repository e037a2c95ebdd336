"""Liveness and readiness."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from api.deps import get_health
from api.readiness import Health

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(health: Annotated[Health, Depends(get_health)]) -> JSONResponse:
    """Redis answers and each enabled kind has a live worker (or need not have one:
    `autoscale.ready_without_workers`); 503 names what is missing. `cold` lists the
    on-demand pipelines no worker has loaded now (their next job loads), `no_workers` the
    pipelines without a live worker (their jobs wait queued for the first to start)."""
    ready = await health.readiness()
    workers = {} if ready.no_workers is None else {"no_workers": ready.no_workers}
    if ready.missing:
        return JSONResponse({"status": "unavailable", "missing": ready.missing, **workers}, 503)
    return JSONResponse({"status": "ready", "kinds": ready.kinds, "cold": ready.cold, **workers})
