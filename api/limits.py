"""A pure ASGI middleware that bounds a request's body: 413 past its path's size limit,
408 when it has not all arrived within its path's time (`api.body_timeout_s`, uploads'
`api.upload_timeout_s`): a client that sends a byte a second holds its connection no
longer."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.error_handlers import Refusal, Refused, send_error


class BodyLimits:
    def __init__(
        self,
        app: ASGIApp,
        limit_for: Callable[[str], int],
        timeout_for: Callable[[str], float],
    ) -> None:
        self.app = app
        self.limit_for = limit_for
        self.timeout_for = timeout_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await send_error(send, 413, "too_large", _over(limit), "body")
            return
        timeout_s = self.timeout_for(scope["path"])
        ends_at = time.monotonic() + timeout_s
        seen = 0
        complete = False
        refusal = Refusal(send)

        async def bounded() -> Message:
            nonlocal seen, complete
            if complete:  # the body is in; what is left to read is the disconnect
                return await receive()
            with anyio.move_on_after(ends_at - time.monotonic()) as waited:
                message = await receive()
            if waited.cancelled_caught:
                reason = f"request body did not arrive within {timeout_s:g} s"
                await refusal.refuse(408, "timeout", reason, "body")
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > limit:
                    await refusal.refuse(413, "too_large", _over(limit), "body")
            return message

        with contextlib.suppress(Refused):
            await self.app(scope, bounded, refusal.send)


def _over(limit: int) -> str:
    return f"request body is over the limit of {limit} bytes"
