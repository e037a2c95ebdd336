"""Event streams of a job: Server-Sent Events and a websocket, both resumable."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse

from api.auth import CurrentCaller, JobOwner, Keys
from api.deps import Follows, Service
from api.error_handlers import error_body
from api.follows import TooManyStreams
from api.key_watch import REVOKED_MESSAGE, while_key_lives
from api.openai.protocol import SSE_KEEPALIVE
from api.service import JobService
from api.streaming import Revocation, stream_job
from jobs.errors import MmqError, NotFound, Unauthorized
from jobs.models import Event

router = APIRouter(prefix="/v1/jobs", tags=["events"])

EVENT_ID = r"^[0-9]{1,19}-[0-9]{1,19}$"
"""A Redis stream id: two numbers that fit 64 bits (Redis refuses larger ones, which
broke the stream), in ASCII digits (`\\d` would take any Unicode digit, and so would a
client that generates values from the published pattern)."""
EVENT_ID_RULE = "must be an event id, two numbers of up to 19 digits (1732700000000-0)"
WS_POLICY_VIOLATION = 1008


def _sse(event: Event) -> tuple[bytes]:
    return (
        b"id: %s\nevent: %s\ndata: %s\n\n"
        % (event.id.encode(), event.type.encode(), _json_bytes(event)),
    )


def _json(event: Event) -> tuple[str]:
    """The event as JSON (`jobs.wire.JobEvent`)."""
    return (_json_bytes(event).decode(),)


def _json_bytes(event: Event) -> bytes:
    """The event as JSON, its data as it came from Redis where it did (not decoded)."""
    data = orjson.Fragment(event.raw) if event.raw else event.data
    fields = {"id": event.id, "job_id": event.job_id, "type": event.type, "data": data}
    return orjson.dumps({**fields, "ts": event.ts})


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def job_events(
    caller: CurrentCaller,
    keys: Keys,
    owner: JobOwner,
    job_id: str,
    service: Service,
    follows: Follows,
    after: Annotated[str | None, Query(pattern=EVENT_ID)] = None,
    last_event_id: Annotated[str | None, Header(pattern=EVENT_ID)] = None,
) -> StreamingResponse:
    """The job's events as SSE: replay from the start (or after `Last-Event-ID` / `after`),
    then live until the terminal status event; a keep-alive comment at least every
    `api.keepalive_s` seconds (15 by default) while it is quiet."""
    frames = await follows.follow(
        caller.owner,  # the key's own count, whoever's job it follows (an admin)
        lambda: stream_job(
            service,
            owner,
            job_id,
            _sse,
            after=last_event_id or after,
            keepalive=SSE_KEEPALIVE,
            join=b"".join,
            revoked=Revocation.of(keys.watch, caller.key_id, SSE_REVOKED),
        ),
    )
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.websocket("/{job_id}/ws")
async def job_ws(
    websocket: WebSocket, job_id: str, service: Service, api_keys: Keys, follows: Follows
) -> None:
    """The same events as JSON messages; `?after=ID` resumes; send `{"type": "cancel"}`
    to cancel. The key goes in `Authorization` or `?token=`."""
    token = websocket.query_params.get("token")
    authorization = websocket.headers.get("authorization") or (f"Bearer {token}" if token else None)
    after = websocket.query_params.get("after")
    if after is not None and not re.match(EVENT_ID, after):
        # As SSE refuses it (422), in the terms a browser's WebSocket can read.
        await websocket.accept()
        await websocket.close(code=WS_POLICY_VIOLATION, reason=f"after: {EVENT_ID_RULE}")
        return
    try:
        caller = await api_keys.caller_of(authorization)
        owner = caller.owner
        frames = await follows.follow(
            owner, lambda: stream_job(service, owner, job_id, _json, after=after)
        )
    except (Unauthorized, NotFound, TooManyStreams) as exc:
        await websocket.send_denial_response(denial(exc))
        return
    await websocket.accept()
    reader = _read_commands(websocket, service, owner, job_id)
    watched = while_key_lives(api_keys.watch, caller.key_id, frames, _WS_REVOKED)
    async with _background(reader), contextlib.aclosing(frames), contextlib.aclosing(watched):
        with contextlib.suppress(WebSocketDisconnect):
            last: str | None = None
            async for last in watched:
                await websocket.send_text(last)
            revoked = last is _WS_REVOKED
            await websocket.close(code=WS_POLICY_VIOLATION if revoked else 1000)


SSE_REVOKED = (
    f"event: error\ndata: {json.dumps(error_body('api_key_revoked', REVOKED_MESSAGE))}\n\n"
).encode()
"""The last frame of an event stream whose key was revoked."""
_WS_REVOKED = json.dumps(error_body("api_key_revoked", REVOKED_MESSAGE))


def denial(exc: Unauthorized | NotFound | TooManyStreams) -> JSONResponse:
    """The HTTP answer to a websocket's handshake that is refused, as a route's."""
    if isinstance(exc, TooManyStreams):
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse(error_body(exc.code, exc.message), 429, headers=headers)
    status = 401 if isinstance(exc, Unauthorized) else 404
    return JSONResponse(error_body(exc.code, exc.message), status)


async def _read_commands(
    websocket: WebSocket, service: JobService, owner: str, job_id: str
) -> None:
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
                    await service.cancel(owner, job_id)
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
