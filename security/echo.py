"""What an error may repeat of a client's input: a short prefix, never the whole of it
(issue 65: an `error` event that echoed a 5 MiB `type` filled Redis through its log)."""

from __future__ import annotations

ECHO_CHARS = 64
"""The most of a client's value that a message repeats."""


def clip(value: object, limit: int = ECHO_CHARS) -> str:
    """`value`'s repr, cut to `limit` characters with how long it was."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"
