"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from api import docs_pages, error_handlers, openapi, plain_routes
from api.batch_service import BatchService
from api.cache import ResponseCache
from api.callers import ApiKeys
from api.deps import AppState
from api.file_service import FileService
from api.follows import FollowLimit
from api.hub import EventHub
from api.jsonguard import RefuseUnstorableJson
from api.limits import BodyLimits
from api.openai import audio as openai_audio
from api.openai import batches as openai_batches
from api.openai import chat as openai_chat
from api.openai import embeddings as openai_embeddings
from api.openai import image_edits as openai_image_edits
from api.openai import images as openai_images
from api.openai import realtime as openai_realtime
from api.openai import rerank as openai_rerank
from api.openai import responses as openai_responses
from api.openai import speech as openai_speech
from api.overview import OverviewReader
from api.prometheus import MetricsReader
from api.ratelimit import RateLimitHeaders
from api.readiness import Health
from api.routes import admin, console, events, files, health, jobs, metrics, whoami
from api.service import JobService
from api.trace_context import TraceContext
from broker.celery_app import make_celery, webhook_sender
from common import redis_client
from common.heap import freeze_startup_heap
from jobs.settings import Settings, load_settings
from jobstore.realtime_sessions import AsyncRealtimeSessions
from jobstore.responses import AsyncResponses
from jobstore.store import AsyncJobStore
from security import handshake_log, redact
from storage.factory import make_storage
from telemetry import tracing

UPLOAD_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
FILES_PATH = "/v1/files"
IMAGE_EDITS_PATH = "/v1/images/edits"
MULTIPART_SLACK_BYTES = 1_048_576
STREAMS_CLEANUP_S = 5.0
"""The most the API's shutdown waits for canceled streams to clean up (a cancel each)."""
"""Room for multipart boundaries and part headers above a file's own size limit."""


def app_from_environment() -> FastAPI:
    """The app of one of several API processes (`api.workers`): its settings come from
    the environment (the Redis URL, host name and config file) that `mmq api` gave them."""
    return create_app(load_settings())


def create_app(settings: Settings) -> FastAPI:
    if not settings.redis_url:
        raise ValueError("redis_url is not set")
    redact.install(redact.known_secrets(settings))  # uvicorn's lines too (`?token=`)
    handshake_log.install()  # a refused websocket is no ERROR line

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        storage = make_storage(settings)
        # A missing or forbidden bucket stops the API here, with the reason.
        await anyio.to_thread.run_sync(storage.check)
        # Blocking: a burst of requests waits for a connection instead of failing. A
        # command whose connection the server closed (Redis restarted, failed over) is
        # sent again on a new one, up to three times, before the request gets a 503.
        client = redis_client.connect_async(
            settings.redis_url or "", max_connections=256, timeout_s=10, resend_on_broken=True
        )
        celery = make_celery(settings)
        store = AsyncJobStore(client, settings, on_event=webhook_sender(celery), metered=True)
        hub = EventHub(client, keepalive_s=settings.api.keepalive_s)
        await hub.start()
        files = FileService(settings, storage, client)
        cache = ResponseCache(settings, store)
        service = JobService(settings, store, celery, hub, files, cache)
        app.state.mmq = AppState(
            settings=settings,
            service=service,
            api_keys=ApiKeys(client, settings),
            health=Health(client, settings),
            metrics=MetricsReader(client, settings),
            overview=OverviewReader(client, settings),
            batches=BatchService(settings, client, files, service),
            follows=FollowLimit(settings.api.max_streams_per_key),
            realtime=AsyncRealtimeSessions(client),
            responses=AsyncResponses(client, settings.job_ttl_s),
        )
        freeze_startup_heap()
        try:
            yield
        finally:
            # Streams that uvicorn canceled at the end of the shutdown grace are cleaning
            # up (a streamed completion cancels its job): not without Redis.
            await service.streams.closed(timeout_s=STREAMS_CLEANUP_S)
            await hub.stop()
            await redis_client.close_async(client)

    app = FastAPI(
        title="mmq",
        summary="Multimodal inference jobs: image, ASR, TTS and LLM on your GPUs.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # docs_pages: from this install's files, not a CDN
        redoc_url=None,
    )
    error_handlers.install(app)
    app.include_router(jobs.router)  # first: requests match routes in this order
    app.include_router(events.router)
    app.include_router(files.router)
    app.include_router(openai_speech.router)
    app.include_router(openai_audio.router)
    app.include_router(openai_images.router)
    app.include_router(openai_image_edits.router)
    app.include_router(openai_chat.router)
    app.include_router(openai_embeddings.router)
    app.include_router(openai_rerank.router)
    app.include_router(openai_batches.router)
    app.include_router(openai_realtime.router)
    app.include_router(openai_responses.router)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(admin.router)
    app.include_router(whoami.router)
    # The LLM routes as plain Starlette routes, matched first (their FastAPI routes above
    # are what the OpenAPI document describes).
    app.router.routes[:0] = plain_routes.ROUTES
    console.mount(app)
    docs_pages.install(app)
    openapi.install(app, settings)

    def limit_for(path: str) -> int:
        if path.startswith(FILES_PATH):
            return settings.storage.max_upload_bytes + MULTIPART_SLACK_BYTES
        if path.startswith(UPLOAD_PATHS):
            return settings.limits.audio_max_bytes + MULTIPART_SLACK_BYTES
        if path.startswith(IMAGE_EDITS_PATH):  # the image and its mask
            return 2 * settings.limits.image_max_bytes + MULTIPART_SLACK_BYTES
        return settings.api.max_body_bytes

    def timeout_for(path: str) -> float:
        if path.startswith((FILES_PATH, IMAGE_EDITS_PATH, *UPLOAD_PATHS)):
            return settings.api.upload_timeout_s
        return settings.api.body_timeout_s

    # Inside the size limit: it reads a bounded body.
    app.add_middleware(RefuseUnstorableJson, max_depth=settings.api.max_json_depth)
    app.add_middleware(BodyLimits, limit_for=limit_for, timeout_for=timeout_for)
    app.add_middleware(RateLimitHeaders)
    if settings.tracing.enabled:  # outermost: a request's start is its trace's
        tracing.setup(settings.tracing, "api")
        app.add_middleware(TraceContext)
    return app
