"""The request's trace context for `telemetry.tracing` (installed where `[tracing]` is on):
each HTTP request notes its client's W3C `traceparent` header and when it came, so that a
job it admits is traced from the request's start, under the client's trace."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from telemetry import tracing


class TraceContext:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            sent = dict(scope["headers"]).get(b"traceparent")
            tracing.note_request(sent.decode("latin-1") if sent else None)
        await self.app(scope, receive, send)
