"""Standard Webhooks signatures.

A delivery is a POST of the event as JSON with `webhook-id`, `webhook-timestamp` and
`webhook-signature` (`v1,` + base64 HMAC-SHA256 over `id.timestamp.body`, keyed with the
base64 bytes after `whsec_`), as https://www.standardwebhooks.com specifies.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def secret_bytes(secret: str) -> bytes:
    raw = secret.removeprefix("whsec_")
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()
