"""A pure ASGI middleware that refuses, with a 422 naming where it is, JSON that parses
but cannot be stored: text no UTF-8 can hold, integers past 64 bits, and values nested
deeper than `api.max_json_depth` (issue 65: a tool schema 130 levels deep was a 500 from
pydantic's serializer; each route would meet its own limit somewhere else).

JSON may spell a lone UTF-16 surrogate (`"\\udfff"`), and any integer; Python's parser
takes both, and the value then fails wherever it is encoded (the store's orjson, a
model's tokenizer) as a 500. Such text can only arrive as a `\\uD800`-`\\uDFFF` escape,
and such a number as a run of 19 digits or more, so a body with neither passes
untouched. Otherwise it is parsed, and the first value (or key) that cannot be stored is
named: `metadata.k`, `messages.0.content`, or the object that holds such a key.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.error_handlers import Refusal, Refused

_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|[0-9]{19}")
"""A surrogate's escape (a pair's too: the parse tells them apart), or a long number."""
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
"""The integers the store encodes (orjson: signed and unsigned 64-bit)."""


_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')
"""A JSON string whole (brackets inside it are text), or a bracket or comma."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class RefuseUnstorableJson:
    def __init__(self, app: ASGIApp, max_depth: int = 64) -> None:
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        first = True
        refusal = Refusal(send)

        async def checked() -> Message:
            """The whole body as one message, once checked (JSON bodies are read whole
            anyway, and `api.limits` has bounded its size and time)."""
            nonlocal first
            if not first:
                return await receive()
            first = False
            parts = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return message
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            body = b"".join(parts)
            where = _too_deep(body, self.max_depth)
            if where is None and _SUSPECT.search(body):
                where = _unstorable(body)
            if where is not None:
                path, what = where
                param = path or "body"
                await refusal.refuse(422, "invalid_input", f"{param}: {what}", param)
            return {"type": "http.request", "body": body, "more_body": False}

        with contextlib.suppress(Refused):
            await self.app(scope, checked, refusal.send)


def _is_json(scope: Scope) -> bool:
    """A body FastAPI reads as JSON: a JSON content type, or none."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return b"json" in value.lower()
    return True


def _too_deep(body: bytes, max_depth: int) -> tuple[str, str] | None:
    """(where, why) of the first object or array nested deeper than `max_depth`, found
    without parsing (a body with fewer brackets than that passes at once); None if none."""
    if body.count(b"[") + body.count(b"{") <= max_depth or not _deeper(body, max_depth):
        return None
    path: list[str] = []
    arrays: list[bool] = []
    want_key = False
    for token in _TOKENS.finditer(body):
        text = token.group()
        if text in (b"{", b"["):
            if len(arrays) >= max_depth:
                return ".".join(path), f"nests deeper than {max_depth} levels (api.max_json_depth)"
            arrays.append(text == b"[")
            path.append("0" if arrays[-1] else "")
            want_key = not arrays[-1]
        elif text in (b"}", b"]"):
            if not arrays:
                return None  # not JSON: the route refuses it as it always has
            arrays.pop()
            path.pop()
        elif text == b",":
            if arrays and arrays[-1]:
                path[-1] = str(int(path[-1]) + 1)
            want_key = bool(arrays) and not arrays[-1]
        elif want_key:
            path[-1] = _key(text)
            want_key = False
    return None


def _deeper(body: bytes, max_depth: int) -> bool:
    """Whether the brackets outside strings nest deeper than `max_depth`: each round takes
    the innermost pairs away, all at C's speed (a body of a million commas is never
    walked in Python); only a body refused then is walked to name the path."""
    # Escaped backslashes, then escaped quotes, go first: every quote left opens or closes
    # a string, and the text outside strings is every other piece between quotes.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = b"".join(unescaped.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not shape:
            return False
        # A mark stands where a pair was until the round ends, so that a round takes one
        # level away ("{[]}" becomes "{.}", not "").
        shape = shape.replace(b"[]", b".").replace(b"{}", b".").replace(b".", b"")
    return bool(shape)


def _key(token: bytes) -> str:
    """An object's key as a path names it (cut short: a path repeats no long input)."""
    try:
        key = str(json.loads(token))
    except ValueError:
        key = token.decode("utf-8", "replace").strip('"')
    return key if len(key) <= 64 else key[:64] + "…"


def _unstorable(body: bytes) -> tuple[str, str] | None:
    """(where, what is wrong) of the first value the store cannot encode, or None."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None  # not JSON: the route refuses it as it always has
    return _find(parsed, [])


LONE_SURROGATE = "holds a lone UTF-16 surrogate, which is not Unicode text"


def _find(value: Any, path: list[str]) -> tuple[str, str] | None:
    if isinstance(value, str):
        return None if _encodes(value) else (".".join(path), f"this text {LONE_SURROGATE}")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return None
        return ".".join(path), "this integer is out of range (64 bits at most)"
    if isinstance(value, dict):
        for key, item in value.items():
            if not _encodes(key):
                return ".".join(path), f"a key of this object {LONE_SURROGATE}"
            if (found := _find(item, [*path, key])) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _find(item, [*path, str(index)])) is not None:
                return found
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
