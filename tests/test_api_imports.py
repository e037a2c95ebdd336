"""The API process never imports model code (no torch, no model libraries), and no request
waits for a thread of FastAPI's pool."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute

from api.app import create_app
from jobs.settings import load_settings
from tuning.deployment import REPO

MODEL_LIBRARIES = ("torch", "diffusers", "transformers", "faster_whisper", "piper", "TTS", "vllm")


def test_the_api_app_imports_no_model_library(redis_url: str, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from jobs.settings import load_settings\n"
        "from api.app import create_app\n"
        "create_app(load_settings())\n"
        f"print(sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules))"
    )
    env = {**os.environ, "MMQ_REDIS_URL": redis_url, "MMQ_DATA_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_no_route_or_dependency_pays_a_thread_hop(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI runs a plain `def` endpoint or dependency on its thread pool: a hop to a
    thread and back on every request (a sync `X-Request-Timeout` dependency cost the API
    about 4 % of its CPU at 400 requests a second). Every one is `async`."""
    monkeypatch.setenv("MMQ_REDIS_URL", redis_url)
    monkeypatch.setenv("MMQ_DATA_DIR", str(tmp_path))
    app = create_app(load_settings())
    hops: list[str] = []

    def walk(dependant: Dependant, where: str) -> None:
        for dep in dependant.dependencies:
            call = dep.call
            if call is not None and not _is_async(call):
                hops.append(f"{where}: {getattr(call, '__qualname__', call)}")
            walk(dep, where)

    routes = _api_routes(app.routes)
    assert len(routes) > 30  # the whole API
    for route in routes:
        if not _is_async(route.endpoint):
            hops.append(f"{route.path}: {route.endpoint.__qualname__}")
        walk(route.dependant, route.path)
    assert hops == []


def _api_routes(routes: Sequence[BaseRoute]) -> list[APIRoute | APIWebSocketRoute]:
    """The app's routes, those of included routers too (FastAPI includes them lazily)."""
    found: list[APIRoute | APIWebSocketRoute] = []
    for route in routes:
        if isinstance(route, APIRoute | APIWebSocketRoute):
            found.append(route)
        elif (router := getattr(route, "original_router", None)) is not None:
            found += _api_routes(router.routes)
    return found


def _is_async(call: Callable[..., Any]) -> bool:
    target = call if inspect.isfunction(call) or inspect.ismethod(call) else call.__call__  # type: ignore[operator]
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)
