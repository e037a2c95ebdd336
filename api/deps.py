"""Process-wide state of the API, built once in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis.asyncio as aredis
from celery import Celery
from fastapi import Request

from jobs.settings import Settings
from jobs.store import AsyncJobStore

if TYPE_CHECKING:
    from api.hub import EventHub
    from api.service import JobService
    from storage.base import Storage


@dataclass
class AppState:
    settings: Settings
    redis: aredis.Redis
    store: AsyncJobStore
    celery: Celery
    hub: EventHub
    service: JobService
    storage: Storage


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.mmq
    return state


async def get_service(request: Request) -> JobService:
    """FastAPI dependency. `async` so that FastAPI calls it on the event loop: a plain
    `def` dependency costs a hop to the thread pool on every request."""
    return get_state(request).service
