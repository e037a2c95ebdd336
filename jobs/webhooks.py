"""Webhooks: which events a job's webhook wants, Standard Webhooks signatures, URL checks.

A delivery is a POST of the event as JSON with `webhook-id`, `webhook-timestamp` and
`webhook-signature` (`v1,` + base64 HMAC-SHA256 over `id.timestamp.body`, keyed with the
base64 bytes after `whsec_`), as https://www.standardwebhooks.com specifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from jobs.states import ends_job

EVENT_CHOICES = frozenset({"terminal", "status", "partial", "progress", "output", "error", "all"})


def wants(events: list[str], etype: str, data: dict[str, Any]) -> bool:
    """Whether a webhook subscribed to `events` gets an event of `etype` with `data`."""
    if "all" in events or etype in events:
        return True
    return "terminal" in events and ends_job(etype, data)


def secret_bytes(secret: str) -> bytes:
    raw = secret.removeprefix("whsec_")
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
