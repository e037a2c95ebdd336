"""OpenAI's rate-limit headers (`x-ratelimit-limit-requests`, `-remaining-requests`,
`-reset-requests`) on the answers of `/v1/jobs` and the OpenAI routes, for a key with a
requests quota (`jobstore.quotas`), and the `-tokens` trio on the answer of an LLM,
embedding or rerank request for a key with a token quota (`quotas.costs.llm`, `.embed`,
`.rerank`).

A pure ASGI middleware gives each request a holder (a context variable set before the
app runs, so the holder is shared whatever tasks the app starts); the code that learns
the key's usage (a submit, or the auth of any other request on those paths) fills it,
and the middleware adds the headers to the answer's start.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PATHS = (
    "/v1/jobs",
    "/v1/chat/",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/audio/",
    "/v1/images/",
    "/v1/rerank",
    "/v2/rerank",
)


@dataclass
class Usage:
    limit: int
    used: int
    window_s: int
    at: float
    name: str = "requests"
    """What is counted: `requests` or `tokens` (the headers' suffix)."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        remaining = max(0, self.limit - self.used)
        reset = f"{reset_after_s(self.window_s, self.at):g}s"
        return [
            (f"x-ratelimit-limit-{self.name}".encode(), str(self.limit).encode()),
            (f"x-ratelimit-remaining-{self.name}".encode(), str(remaining).encode()),
            (f"x-ratelimit-reset-{self.name}".encode(), reset.encode()),
        ]


def reset_after_s(window_s: int, at: float) -> float:
    """Seconds until the window that `at` falls in ends (whole seconds, at least 1)."""
    return max(1.0, math.ceil(window_s - at % window_s))


_holder: ContextVar[dict[str, Usage] | None] = ContextVar("mmq_ratelimit", default=None)


def note(usage: Usage) -> None:
    """The key's usage of `usage.name`, for this request's answer (no-op outside a
    watched path)."""
    holder = _holder.get()
    if holder is not None:
        holder[usage.name] = usage


def watching() -> bool:
    """Whether this request's answer carries the headers (its path is one of `PATHS`)."""
    return _holder.get() is not None


class RateLimitHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PATHS):
            await self.app(scope, receive, send)
            return
        holder: dict[str, Usage] = {}
        token = _holder.set(holder)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and holder:
                added = [h for usage in holder.values() for h in usage.headers()]
                message["headers"] = [*message.get("headers", []), *added]
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        finally:
            _holder.reset(token)
