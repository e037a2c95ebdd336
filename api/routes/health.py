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
    """Redis answers and each enabled kind has a live worker; 503 names what is missing.
    `cold` lists the on-demand pipelines no worker has loaded now (their next job loads)."""
    ready = await health.readiness()
    if ready.missing:
        return JSONResponse({"status": "unavailable", "missing": ready.missing}, 503)
    return JSONResponse({"status": "ready", "kinds": ready.kinds, "cold": ready.cold})
