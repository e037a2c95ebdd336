"""The API in this test's own process: `create_app(settings)` with its lifespan run,
driven through httpx's ASGI transport against the session's real Redis, with no worker.

For validation, auth and header tests: a failure shows the route's traceback, and no
process starts. Nothing drains the queues, so submitted jobs stay queued.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
from fastapi import FastAPI

from api.app import create_app
from jobs.settings import (
    ApiSettings,
    AuthSettings,
    KindConfig,
    PipelineConfig,
    QueueSettings,
    Settings,
    WebhookSettings,
)
from jobstore.api_keys import create_key

BASE_URL = "http://mmq.test"
MAX_WAIT_S = 1.0
"""Cap on `Prefer: wait=N` here (nothing ends a job but a cancel, so waits run out)."""
SLEEP_QUEUE_LIMIT = 2
"""Queued `sleep` jobs before a submit gets 429 (nothing drains the queue here)."""


def inprocess_settings(
    redis_url: str, data_dir: Path, *, auth: bool = True, webhook_secret: str | None = None
) -> Settings:
    """The test kinds `echo` and `sleep`, an `image` pipeline and two `llm` ones, on
    `transformers serve` (`m`) and on vLLM (`v`) (no worker serves any of them); a small
    `sleep` queue; auth required unless `auth` is False."""
    return Settings(
        redis_url=redis_url,
        data_dir=data_dir,
        auth=AuthSettings(required=auth),
        webhooks=WebhookSettings(secret=webhook_secret),
        api=ApiSettings(max_wait_s=MAX_WAIT_S, keepalive_s=1.0),
        queue=QueueSettings(max_queued_by_kind={"sleep": SLEEP_QUEUE_LIMIT}),
        kinds={
            "echo": KindConfig(schema="harness.pipelines:EchoInput"),
            "sleep": KindConfig(schema="harness.pipelines:SleepInput"),
        },
        pipelines={
            "echo": PipelineConfig(kind="echo", impl="harness.pipelines:EchoPipeline"),
            "sleep": PipelineConfig(kind="sleep", impl="harness.pipelines:SleepPipeline"),
            "img": PipelineConfig(kind="image", impl="pipelines.image:ImagePipeline", model="m"),
            "chat": PipelineConfig(kind="llm", impl="pipelines.llm:LlmPipeline", model="m"),
            "chat-vllm": PipelineConfig(
                kind="llm",
                impl="pipelines.llm:LlmPipeline",
                model="v",
                options={"engine": "vllm"},
            ),
        },
    )


@dataclass
class InProcess:
    """One running app, and clients for it."""

    app: FastAPI
    settings: Settings
    redis: redis.Redis

    def client(self, key: str | None = None) -> httpx.AsyncClient:
        """A client sending `key` as its bearer token (none: no Authorization header)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers)

    def owner(self, name: str) -> httpx.AsyncClient:
        """A client with a new API key of the owner `name`."""
        return self.client(create_key(self.redis, name))


@contextlib.asynccontextmanager
async def serve_in_process(settings: Settings) -> AsyncIterator[InProcess]:
    """The app with its lifespan running (as uvicorn runs it) until the block ends."""
    app = create_app(settings)
    client = redis.Redis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        async with app.router.lifespan_context(app):
            yield InProcess(app, settings, client)
    finally:
        client.close()
