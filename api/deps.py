"""Process-wide state of the API, built once in the app's lifespan, and the FastAPI
dependencies that hand its parts to routes. Routes never see the Redis client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from api.batch_service import BatchService
from api.callers import ApiKeys
from api.file_service import FileService
from api.follows import FollowLimit
from api.overview import OverviewReader
from api.prometheus import MetricsReader
from api.readiness import Health
from api.service import JobService
from jobs.settings import Settings
from jobstore.realtime_sessions import AsyncRealtimeSessions
from jobstore.responses import AsyncResponses


@dataclass(frozen=True)
class AppState:
    settings: Settings
    service: JobService
    """The one door to jobs (and the files their inputs name)."""
    api_keys: ApiKeys
    health: Health
    metrics: MetricsReader
    overview: OverviewReader
    batches: BatchService
    follows: FollowLimit
    """Job event streams open per key (`api.max_streams_per_key`)."""
    realtime: AsyncRealtimeSessions
    """Voice sessions: client secrets, the sessions a key holds, their stored events."""
    responses: AsyncResponses
    """Stored responses of the Responses API (`/v1/responses`)."""


def get_state(conn: HTTPConnection) -> AppState:
    state: AppState = conn.app.state.mmq
    return state


# The dependencies are `async` so that FastAPI calls them on the event loop: a plain
# `def` dependency costs a hop to the thread pool on every request.


async def get_settings(conn: HTTPConnection) -> Settings:
    return get_state(conn).settings


async def get_service(conn: HTTPConnection) -> JobService:
    return get_state(conn).service


async def get_files(conn: HTTPConnection) -> FileService:
    return get_state(conn).service.files


async def get_batches(conn: HTTPConnection) -> BatchService:
    return get_state(conn).batches


async def get_health(conn: HTTPConnection) -> Health:
    return get_state(conn).health


async def get_metrics(conn: HTTPConnection) -> MetricsReader:
    return get_state(conn).metrics


async def get_follows(conn: HTTPConnection) -> FollowLimit:
    return get_state(conn).follows


async def get_overview(conn: HTTPConnection) -> OverviewReader:
    return get_state(conn).overview


async def get_realtime(conn: HTTPConnection) -> AsyncRealtimeSessions:
    return get_state(conn).realtime


async def get_responses(conn: HTTPConnection) -> AsyncResponses:
    return get_state(conn).responses


SettingsDep = Annotated[Settings, Depends(get_settings)]
Service = Annotated[JobService, Depends(get_service)]
Files = Annotated[FileService, Depends(get_files)]
Batches = Annotated[BatchService, Depends(get_batches)]
Follows = Annotated[FollowLimit, Depends(get_follows)]
Realtime = Annotated[AsyncRealtimeSessions, Depends(get_realtime)]
StoredResponses = Annotated[AsyncResponses, Depends(get_responses)]
