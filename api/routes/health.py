"""Liveness and readiness."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.deps import get_state
from jobs import keys

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Redis answers and each enabled kind has a live worker; 503 names what is missing."""
    state = get_state(request)
    try:
        await state.redis.ping()
        live_kinds = await _live_kinds(request)
    except (RedisError, OSError) as exc:
        return JSONResponse({"status": "unavailable", "missing": [f"redis: {exc}"]}, 503)
    missing = [f"worker for kind {k}" for k in state.settings.enabled_kinds if k not in live_kinds]
    if missing:
        return JSONResponse({"status": "unavailable", "missing": missing}, 503)
    return JSONResponse({"status": "ready", "kinds": sorted(live_kinds)})


async def _live_kinds(request: Request) -> set[str]:
    state = get_state(request)
    stale_s = state.settings.lease.heartbeat_s * 3
    names = await state.redis.zrangebyscore(keys.WORKERS, time.time() - stale_s, "+inf")
    if not names:
        return set()
    pipe = state.redis.pipeline(transaction=False)
    for name in names:
        pipe.hget(keys.worker(name), "kind")
    return {kind for kind in await pipe.execute() if kind}
