"""Event streams of a job: Server-Sent Events and a websocket, both resumable."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse

from api.auth import current_owner, owner_from_key
from api.deps import AppState, get_service, get_state
from api.errors import error_body
from api.service import JobService
from api.streams import follow
from jobs.errors import MmqError, NotFound, Unauthorized

router = APIRouter(prefix="/v1/jobs", tags=["events"])

EVENT_ID = r"^\d+-\d+$"


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_events(
    request: Request,
    job_id: str,
    owner: Annotated[str, Depends(current_owner)],
    service: Annotated[JobService, Depends(get_service)],
    after: Annotated[str | None, Query(pattern=EVENT_ID)] = None,
    last_event_id: Annotated[str | None, Header(pattern=EVENT_ID)] = None,
) -> StreamingResponse:
    """The job's events as SSE: replay from the start (or after `Last-Event-ID` / `after`),
    then live until the terminal status event; a keep-alive comment every 15 s."""
    await service.get(owner, job_id)
    state = get_state(request)
    return StreamingResponse(
        _sse(state, job_id, last_event_id or after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _sse(state: AppState, job_id: str, after: str | None) -> AsyncIterator[str]:
    keepalive_s = state.settings.api.keepalive_s
    async for event in follow(state.store, state.hub, job_id, after, keepalive_s):
        if event is None:
            yield ": keep-alive\n\n"
            continue
        yield f"id: {event.id}\nevent: {event.type.value}\ndata: {event.model_dump_json()}\n\n"


@router.websocket("/{job_id}/ws")
async def job_ws(websocket: WebSocket, job_id: str) -> None:
    """The same events as JSON messages; `?after=ID` resumes; send `{"type": "cancel"}`
    to cancel. The key goes in `Authorization` or `?token=`."""
    state: AppState = websocket.app.state.mmq
    token = websocket.query_params.get("token")
    authorization = websocket.headers.get("authorization") or (f"Bearer {token}" if token else None)
    try:
        owner = await owner_from_key(state, authorization)
        await state.service.get(owner, job_id)
    except (Unauthorized, NotFound) as exc:
        status = 401 if isinstance(exc, Unauthorized) else 404
        denial = JSONResponse(error_body(exc.code, exc.message), status)
        await websocket.send_denial_response(denial)
        return
    await websocket.accept()
    after = websocket.query_params.get("after")
    reader = _read_commands(websocket, state, owner, job_id)
    async with _background(reader):
        with contextlib.suppress(WebSocketDisconnect):
            events = follow(state.store, state.hub, job_id, after, state.settings.api.keepalive_s)
            async for event in events:
                if event is not None:
                    await websocket.send_text(event.model_dump_json())
            await websocket.close(code=1000)


async def _read_commands(websocket: WebSocket, state: AppState, owner: str, job_id: str) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            raw = await websocket.receive_text()
            try:
                command = json.loads(raw)
            except json.JSONDecodeError:
                await websocket.send_text(json.dumps(error_body("invalid_input", "not JSON")))
                continue
            if isinstance(command, dict) and command.get("type") == "cancel":
                try:
                    await state.service.cancel(owner, job_id)
                except MmqError as exc:
                    await websocket.send_text(json.dumps(error_body(exc.code, exc.message)))
            else:
                message = 'unknown command; send {"type": "cancel"}'
                await websocket.send_text(json.dumps(error_body("invalid_input", message)))


@contextlib.asynccontextmanager
async def _background(coro: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
