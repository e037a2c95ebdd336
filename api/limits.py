"""A pure ASGI middleware that answers 413 to a body over its path's size limit."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_body


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _too_large(send, limit)
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit and not refused:
                    refused = True
                    await _too_large(send, limit)
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # Once the 413 is out, whatever the app answers to the aborted read is dropped.
            if not refused:
                await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, counted, guarded_send)


async def _too_large(send: Send, limit: int) -> None:
    body = json.dumps(
        error_body("too_large", f"request body is over the limit of {limit} bytes", "body")
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
