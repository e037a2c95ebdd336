"""Prometheus metrics of the whole deployment. A scrape without an API key sees what
`api.metrics_without_key` allows (by default all but the per-key series, which name the
keys' owners); an admin key's scrape sees all."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from api.auth import Keys
from api.deps import SettingsDep, get_metrics
from api.prometheus import MetricsReader, render
from jobs.errors import Unauthorized

router = APIRouter(tags=["health"])


@router.get("/metrics")
async def metrics(
    request: Request,
    reader: Annotated[MetricsReader, Depends(get_metrics)],
    settings: SettingsDep,
    api_keys: Keys,
) -> Response:
    """Jobs by kind and status, queue depth, latency and batch histograms, workers, GPUs."""
    authorization = request.headers.get("authorization")
    if authorization or not settings.auth.required:
        per_key = (await api_keys.caller_of(authorization)).admin
    elif settings.api.metrics_without_key == "none":
        raise Unauthorized("/metrics needs an API key here (api.metrics_without_key = none)")
    else:
        per_key = settings.api.metrics_without_key == "all"
    snapshot = await reader.snapshot(per_key)
    return Response(render(snapshot, settings), headers={"Content-Type": CONTENT_TYPE_LATEST})
