"""OpenAI's Realtime API: `/v1/realtime` over websocket, its client secrets, and a session's
stored events.

Authentication is OpenAI's: a server sends its API key in `Authorization`; a browser, which
cannot set that header on a websocket, first gets a short-lived client secret (`POST
/v1/realtime/client_secrets`, with the key) and opens the socket with the subprotocols
`realtime` and `openai-insecure-api-key.<secret>`. A secret acts for its key: the
session's jobs are the key's, under its quotas. A key holds `realtime.max_sessions_per_key`
sessions at once across the API processes; a session lives `realtime.max_session_s`; over
either the client gets an `error` event naming the limit, then the socket closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Header, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from api.auth import CurrentCaller, Owner
from api.callers import ApiKeys
from api.deps import Realtime, Service, SettingsDep, get_state
from api.key_watch import REVOKED_MESSAGE
from api.openai.protocol import OpenAIBaseModel, OpenAIRequest, event_stream, responses
from api.routes.events import EVENT_ID, WS_POLICY_VIOLATION, denial
from api.service import JobService
from jobs.errors import InputError, NotFound, QuotaExceeded, TooLarge, Unauthorized
from jobs.realtime_settings import RealtimeSettings
from jobs.settings import Settings
from jobstore.realtime_sessions import (
    SECRET_PREFIX,
    AsyncRealtimeSessions,
    LogBudget,
    TooManySecrets,
)
from realtime import config as cfg
from realtime import server_events as ev
from realtime.session import Session, check_config
from realtime.vad import TurnDetection, VadStream
from security.echo import clip
from telemetry.metric_defs import turn_samples

router = APIRouter(prefix="/v1/realtime", tags=["openai"])
log = logging.getLogger(__name__)

PROTOCOL_KEY = "openai-insecure-api-key."
HOLD_S = 30.0
"""A session's slot among its key's lives this long unless renewed (every third of it):
an API process that dies frees its sessions' slots within it."""


class ExpiresAfter(OpenAIBaseModel):
    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(ge=10, le=7200)


class ClientSecretRequest(OpenAIRequest):
    """OpenAI's `client_secrets.create`: the secret's life and the session it opens."""

    expires_after: ExpiresAfter | None = None
    session: dict[str, JsonValue] | None = None


class ClientSecret(BaseModel):
    value: str
    """`ek_...`: open the websocket with it (`openai-insecure-api-key.<value>`)."""
    expires_at: int
    session: dict[str, JsonValue]


class StoredEvent(BaseModel):
    """One stored event of a session: a server event as the client got it (its `type`
    and `event_id` and its own fields), or mmq's `mmq.turn` record of a turn's stage
    times (never sent to the client)."""

    model_config = ConfigDict(extra="allow")

    type: str
    event_id: str | None = None


@router.post(
    "/client_secrets", response_model=ClientSecret, responses=responses(401, 413, 422, 429, 503)
)
async def create_client_secret(
    caller: CurrentCaller,
    body: ClientSecretRequest,
    settings: SettingsDep,
    sessions: Realtime,
    service: Service,
) -> ClientSecret:
    """A short-lived secret that opens one session as this key (for a browser)."""
    config = cfg.parse(body.session or {}, "session")
    rt = settings.realtime
    stored = config.model_dump(mode="json", exclude_defaults=True)
    size = len(orjson.dumps(stored))
    if size > rt.max_secret_bytes:
        raise TooLarge(
            "session",
            f"is {size} bytes as stored; a client secret keeps {rt.max_secret_bytes} at most "
            "(realtime.max_secret_bytes): send the rest in session.update",
        )
    check_config(config, rt, service)
    ttl_s = body.expires_after.seconds if body.expires_after else rt.client_secret_ttl_s
    try:
        value, expires_at = await sessions.create_secret(
            caller.owner, caller.key_id, stored, ttl_s, rt.max_secrets_per_key
        )
    except TooManySecrets as exc:
        raise QuotaExceeded(
            f"this key holds {rt.max_secrets_per_key} unexpired client secrets, the most it "
            "may (realtime.max_secrets_per_key)",
            exc.retry_after_s,
            "realtime.max_secrets_per_key",
        ) from None
    view = ev.session_view("sess_pending", config, expires_at)
    assert isinstance(view, dict)
    return ClientSecret(value=value, expires_at=expires_at, session=view)


@router.get(
    "/sessions/{session_id}/events",
    response_class=StreamingResponse,
    responses=responses(401, 404, 422, 503, ok={"content": event_stream(StoredEvent)}),
)
async def session_events(
    owner: Owner,
    session_id: str,
    sessions: Realtime,
    after: Annotated[str | None, Query(pattern=EVENT_ID)] = None,
    last_event_id: Annotated[str | None, Header(pattern=EVENT_ID)] = None,
) -> StreamingResponse:
    """A session's stored events as SSE, from the start (or after `Last-Event-ID` /
    `after`) to the last one stored: the server events it sent, and a `mmq.turn` record of
    each turn's stage times."""
    if await sessions.owner_of(session_id) != owner:
        raise NotFound(f"no session {clip(session_id)}")

    async def frames() -> AsyncIterator[str]:
        cursor = last_event_id or after
        while True:
            page = await sessions.events(session_id, cursor, 500)
            for event_id, data in page:
                yield f"id: {event_id}\ndata: {data}\n\n"
            if len(page) < 500:
                return
            cursor = page[-1][0]

    return StreamingResponse(frames(), media_type="text/event-stream")


@router.websocket("")
async def realtime(
    websocket: WebSocket,
    model: Annotated[str | None, Query(max_length=256)] = None,
    intent: Annotated[Literal["conversation", "transcription"] | None, Query()] = None,
) -> None:
    """A Realtime session (OpenAI's events; `?intent=transcription` for one that only
    transcribes)."""
    state = get_state(websocket)
    settings, sessions = state.settings, state.realtime
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",")]
    try:
        owner, key_id, preset = await _authenticate(websocket, state.api_keys, sessions, offered)
    except Unauthorized as exc:
        await websocket.send_denial_response(denial(exc))
        return
    await websocket.accept(subprotocol="realtime" if "realtime" in offered else None)
    kind: cfg.SessionType = "transcription" if intent == "transcription" else "realtime"
    config = preset or cfg.SessionConfig(type=kind)
    if model and config.type == "realtime":
        config = config.model_copy(update={"model": model})
    session = _session(websocket, state.service, sessions, settings, owner, config)
    pump = asyncio.create_task(session.pump())
    held = await sessions.open(owner, session.id, settings.realtime.max_sessions_per_key, HOLD_S)
    if not held:
        limit = settings.realtime.max_sessions_per_key
        await session.fail(
            f"this key holds {limit} realtime sessions open, the most it may "
            "(realtime.max_sessions_per_key); close one first",
            "session_limit_reached",
        )
        await session.close()
        await pump
        await websocket.close(code=1008, reason="realtime.max_sessions_per_key")
        return
    renew = asyncio.create_task(_keep(sessions, owner, session.id))
    revoked = asyncio.Event()
    try:
        async with state.api_keys.watch.revoked(key_id) as revoked:
            await session.start()
            # The model `?model=` names, which this deployment may lack (the voice is checked
            # when a session.update names one; a client secret's session when it was made).
            named = config.model_copy(update={"output_modalities": ["text"]})
            try:
                session.check(named if config.type == "realtime" else config)
            except InputError as exc:
                await session.fail(exc.reason, exc.code, exc.field)
            await _serve_while_key_lives(websocket, session, settings.realtime, revoked)
    finally:
        renew.cancel()
        await session.close()
        with contextlib.suppress(Exception):
            await pump
        await sessions.close(owner, session.id)
        with contextlib.suppress(Exception):
            if revoked.is_set():
                await websocket.close(code=WS_POLICY_VIOLATION, reason="api key revoked")
            else:
                await websocket.close()


async def _serve_while_key_lives(
    websocket: WebSocket, session: Session, rt: RealtimeSettings, revoked: asyncio.Event
) -> None:
    """`_serve`, ended with an `error` event (its responses and their jobs canceled) once
    the session's key is revoked: a secret or a session never outlives its key."""
    serving = asyncio.ensure_future(_serve(websocket, session, rt.max_session_s))
    gone = asyncio.ensure_future(revoked.wait())
    try:
        await asyncio.wait({serving, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not serving.done():
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
    if revoked.is_set():
        await session.fail(f"{REVOKED_MESSAGE}: the session ends", "api_key_revoked")
    else:
        serving.result()


async def _serve(websocket: WebSocket, session: Session, max_session_s: float) -> None:
    """The client's events until it goes away or the session reaches its longest life."""
    try:
        async with asyncio.timeout(max_session_s):
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                if text is None:
                    await session.fail("send events as JSON text frames", "invalid_event", "event")
                    continue
                await session.handle(text)
    except TimeoutError:
        await session.fail(
            f"the session reached its longest life, {max_session_s:g} s "
            "(realtime.max_session_s); open a new one",
            "session_expired",
        )
    except WebSocketDisconnect:
        return


def _session(
    websocket: WebSocket,
    service: JobService,
    sessions: AsyncRealtimeSessions,
    settings: Settings,
    owner: str,
    config: cfg.SessionConfig,
) -> Session:
    rt = settings.realtime
    session_id = ev.new_id("sess")
    budget = LogBudget(rt.events_ttl_s, rt.max_session_log_bytes, rt.max_key_log_bytes)

    async def send(text: str) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await websocket.send_text(text)

    async def store_audio(owner: str, data: bytes) -> str:
        stored = await service.files.store(owner, io.BytesIO(data), "turn.wav", "audio/wav")
        return stored.key

    class Log:
        async def append(self, events: list[str]) -> None:
            await sessions.append(session_id, owner, events, budget)

        async def observe(self, stages: dict[str, float]) -> None:
            await sessions.observe(turn_samples(stages))

    def vad(detection: cfg.ServerVad) -> VadStream:
        return VadStream(
            TurnDetection(
                detection.threshold, detection.prefix_padding_ms, detection.silence_duration_ms
            )
        )

    return Session(
        session_id=session_id,
        owner=owner,
        config=config,
        settings=rt,
        jobs=service,
        checks=service,
        store_audio=store_audio,
        send=send,
        events_log=Log(),
        vad=vad,
        expires_at=int(time.time() + rt.max_session_s),
    )


async def _authenticate(
    websocket: WebSocket,
    api_keys: ApiKeys,
    sessions: AsyncRealtimeSessions,
    offered: list[str],
) -> tuple[str, str | None, cfg.SessionConfig | None]:
    """The owner, its key (by hash; None without one), and the session a client secret
    preset (None for an API key). A secret whose key was revoked is refused."""
    token = next((p[len(PROTOCOL_KEY) :] for p in offered if p.startswith(PROTOCOL_KEY)), None)
    authorization = websocket.headers.get("authorization")
    if token is None and authorization:
        scheme, _, value = authorization.partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else None
    if token is not None and token.startswith(SECRET_PREFIX):
        found = await sessions.resolve_secret(token)
        if found is None:
            raise Unauthorized("unknown or expired client secret")
        owner, key_id, session = found
        return owner, key_id, cfg.parse(session)
    caller = await api_keys.caller_of(f"Bearer {token}" if token else None)
    return caller.owner, caller.key_id, None


async def _keep(sessions: AsyncRealtimeSessions, owner: str, session_id: str) -> None:
    while True:
        await asyncio.sleep(HOLD_S / 3)
        if not await sessions.renew(owner, session_id, HOLD_S):
            await sessions.open(owner, session_id, 0, HOLD_S)
