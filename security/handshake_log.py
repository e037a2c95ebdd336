"""A refused websocket handshake writes no ERROR line (issue 65).

mmq refuses a handshake (no key, an unknown job, too many streams) with a denial response,
the ASGI way to answer it with an HTTP status and body (`websocket.http.response.start`).
uvicorn's websockets-sansio protocol, the one it picks by default since 0.35 (0.54 here),
sends that response whole, logs the refusal at INFO ("connection rejected (401
Unauthorized)"), and then logs "ASGI callable returned without completing handshake." at
ERROR as well, since it counts only an accepted or closed socket as a completed handshake.
Anyone without a key could fill the log with ERROR lines. This filter drops that one
message of that one logger; `tests/test_security_realtime.py` guards it (a uvicorn that
renames the message fails the test, one that stops logging it passes)."""

from __future__ import annotations

import logging

UVICORN_LOGGER = "uvicorn.error"
NOISE = "ASGI callable returned without completing handshake."


class _DropDenialNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != NOISE


def install() -> None:
    """Drop the message from uvicorn's error logger (once per process)."""
    logger = logging.getLogger(UVICORN_LOGGER)
    if not any(isinstance(f, _DropDenialNoise) for f in logger.filters):
        logger.addFilter(_DropDenialNoise())
