"""Maps domain errors and request validation errors to HTTP answers.

Every error body is an `ErrorResponse`, `{"error": {"type", "message", "param"}}` (OpenAI
clients read it).
Redis that does not answer, or answers as a replica (a failover under way), is 503
with Retry-After, like `Unavailable`: the client may send the request again (with the
same Idempotency-Key, a submit that did land is not made twice).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any, NoReturn

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerError
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Send

from common.redis_client import FAILOVER_ERRORS
from jobs.errors import (
    Conflict,
    Forbidden,
    InputError,
    MmqError,
    NotFound,
    QueueFull,
    TooLarge,
    Unauthorized,
    Unavailable,
)

log = logging.getLogger(__name__)

RETRY_AFTER_S = 2
"""Retry-After of a 503: Sentinel names a new master a few seconds after the old one
died (`down-after-milliseconds` plus the failover itself)."""

STATUS: list[tuple[type[MmqError], int]] = [
    (TooLarge, 413),
    (InputError, 422),
    (NotFound, 404),
    (QueueFull, 429),
    (Conflict, 409),
    (Unauthorized, 401),
    (Forbidden, 403),
    (Unavailable, 503),
]


def _absent(value: object) -> bool:
    return value is None


class ErrorDetail(BaseModel):
    param: str
    message: str


class ErrorInfo(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    type: str
    """What went wrong: `invalid_input`, `not_found`, `queue_full`, `unauthorized`..."""
    message: str
    param: str | None = None
    """The request's field at fault (`messages.0.content`, `X-Request-Timeout`), where
    one is."""
    details: list[ErrorDetail] | None = Field(default=None, exclude_if=_absent)
    """Each field that the request's schema refused, where it broke it."""


class ErrorResponse(BaseModel):
    """The body of every error answer: OpenAI's error format."""

    error: ErrorInfo


def error_response(etype: str, message: str, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(type=etype, message=message, param=param))


def error_body(etype: str, message: str, param: str | None = None) -> dict[str, object]:
    return error_response(etype, message, param).model_dump()


def error_answer(
    body: ErrorResponse, status: int, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def send_error(
    send: Send, status: int, etype: str, message: str, param: str | None = None
) -> None:
    """An error answer sent from a pure ASGI middleware (before any route ran); the
    connection closes after it (the request's body may be left unread)."""
    body = json.dumps(error_body(etype, message, param)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Refused(Exception):
    """Raised into the app by a middleware's `receive` once `Refusal.refuse` answered."""


class Refusal:
    """A pure ASGI middleware's answer in place of the app's, for a request it refuses
    while the app reads its body: `refuse` sends it (and raises `Refused` into the app's
    read); `send` is the app's send, which drops whatever the app answers after it."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.sent = False

    async def refuse(self, status: int, etype: str, message: str, param: str) -> NoReturn:
        self.sent = True
        await send_error(self._send, status, etype, message, param)
        raise Refused

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if not self.sent:
            await self._send(message)


def status_of(exc: MmqError) -> int:
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    return 500


async def on_mmq_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MmqError)
    headers: dict[str, str] = {}
    if isinstance(exc, QueueFull | Unavailable):
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    param = exc.field if isinstance(exc, InputError) else None
    return error_answer(error_response(exc.code, exc.message, param), status_of(exc), headers)


def _loc(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "header", "path"}:
        parts = parts[1:]
    return ".".join(parts)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # its loc is ("body", offset): name the body
        message = f"body: {first['msg']} (at character {_loc(first.get('loc', ()))})"
        body = error_response("invalid_input", message, "body")
        body.error.details = [ErrorDetail(param="body", message=message)]
        return error_answer(body, 422)
    param = _loc(first.get("loc", ())) or None
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    body = error_response("invalid_input", message, param)
    body.error.details = [
        ErrorDetail(param=_loc(e.get("loc", ())), message=str(e.get("msg", ""))) for e in errors
    ]
    return error_answer(body, 422)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    etype = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_answer(error_response(etype, str(exc.detail)), exc.status_code, exc.headers)


async def on_redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("%s %s: Redis unavailable: %s: %s", request.method, request.url.path,
                type(exc).__name__, exc)  # fmt: skip
    message = "Redis is unavailable (a failover may be under way); retry"
    headers = {"Retry-After": str(RETRY_AFTER_S)}
    return error_answer(error_response("unavailable", message), 503, headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(MmqError, on_mmq_error)
    # A broker error is Redis's too, met through kombu (a webhook delivery enqueued).
    for cls in (*FAILOVER_ERRORS, BrokerError):
        app.add_exception_handler(cls, on_redis_unavailable)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
