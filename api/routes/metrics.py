"""Prometheus metrics of the whole deployment (no API key: scrape it from your network)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.deps import SettingsDep, get_metrics
from api.metrics import MetricsReader, render

router = APIRouter(tags=["health"])


@router.get("/metrics")
async def metrics(
    reader: Annotated[MetricsReader, Depends(get_metrics)], settings: SettingsDep
) -> Response:
    """Jobs by kind and status, queue depth, latency and batch histograms, workers, GPUs."""
    snapshot = await reader.snapshot()
    return Response(render(snapshot, settings), headers={"Content-Type": CONTENT_TYPE_LATEST})
