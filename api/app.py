"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aredis
from fastapi import FastAPI

from api import errors
from api.deps import AppState
from api.hub import EventHub
from api.limits import BodySizeLimit
from api.routes import events, health, jobs
from api.service import JobService
from jobs.broker import make_celery, webhook_sender
from jobs.settings import Settings
from jobs.store import AsyncJobStore

UPLOAD_PATHS = ("/v1/files", "/v1/audio/")


def create_app(settings: Settings) -> FastAPI:
    if not settings.redis_url:
        raise ValueError("redis_url is not set")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = aredis.Redis.from_url(
            settings.redis_url or "", decode_responses=True, max_connections=256
        )
        celery = make_celery(settings)
        store = AsyncJobStore(client, settings, on_event=webhook_sender(celery))
        hub = EventHub(client)
        await hub.start()
        service = JobService(settings, store, celery, hub)
        app.state.mmq = AppState(settings, client, store, celery, hub, service)
        try:
            yield
        finally:
            await hub.stop()
            await client.aclose()

    app = FastAPI(
        title="mmq",
        summary="Multimodal inference jobs: image, ASR, TTS and LLM on your GPUs.",
        version="0.1.0",
        lifespan=lifespan,
    )
    errors.install(app)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(events.router)

    def limit_for(path: str) -> int:
        if path.startswith(UPLOAD_PATHS):
            return settings.limits.audio_max_bytes + 1_048_576
        return settings.api.max_body_bytes

    app.add_middleware(BodySizeLimit, limit_for=limit_for)
    return app
