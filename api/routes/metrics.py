"""Prometheus metrics of the whole deployment (no API key: scrape it from your network)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.deps import get_state
from api.metrics import read_snapshot, render

router = APIRouter(tags=["health"])


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Jobs by kind and status, queue depth, latency and batch histograms, workers, GPUs."""
    state = get_state(request)
    snapshot = await read_snapshot(state.redis, state.settings)
    return Response(render(snapshot, state.settings), headers={"Content-Type": CONTENT_TYPE_LATEST})
