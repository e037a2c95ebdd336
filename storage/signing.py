"""Signed download URLs of the local backend: HMAC-SHA256 over the key and the expiry.

`GET /v1/files/KEY?expires=UNIX_S&signature=HEX` serves the file without an API key
until `expires`. The secret is `storage.signing_secret`, or else a random 32-byte key
created once in the data directory (mode 0600): every process that can serve a local
file shares that directory, so they all sign and verify alike.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path
from urllib.parse import quote

from jobs.errors import Unauthorized

SECRET_BYTES = 32


class SignatureError(Unauthorized):
    """A signed URL that is expired, tampered with, or malformed."""


class Signer:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a signing secret has at least 16 bytes")
        self._secret = secret

    def signature(self, key: str, expires_s: int) -> str:
        message = f"{key}\n{expires_s}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sign(self, key: str, ttl_s: int, now: float | None = None) -> tuple[int, str]:
        """(expires, signature) for a URL to `key` valid for `ttl_s` seconds."""
        expires_s = int(now if now is not None else time.time()) + ttl_s
        return expires_s, self.signature(key, expires_s)

    def url(self, base_url: str, key: str, ttl_s: int) -> str:
        expires_s, signature = self.sign(key, ttl_s)
        return f"{base_url}/v1/files/{quote(key)}?expires={expires_s}&signature={signature}"

    def verify(self, key: str, expires: str, signature: str, now: float | None = None) -> None:
        """Raise `SignatureError` unless `signature` is this key's and `expires` has not passed."""
        if not expires.isdigit() or len(expires) > 12:
            raise SignatureError("signed URL: expires is not a unix time")
        expected = self.signature(key, int(expires))
        if not hmac.compare_digest(expected.encode(), signature.lower().encode()):
            raise SignatureError("signed URL: the signature does not match")
        if int(expires) < (now if now is not None else time.time()):
            raise SignatureError("signed URL: it has expired")


def load_or_create_secret(path: Path) -> bytes:
    """The secret kept in `path`, created (0600) by the first process that asks."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(SECRET_BYTES))
            out.flush()
            os.fsync(out.fileno())
        try:
            # A hard link appears whole or not at all, and never replaces another
            # process's secret: the loser of a race reads the winner's.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    secret = path.read_bytes()
    if len(secret) < SECRET_BYTES:
        raise ValueError(f"{path} holds a signing secret shorter than {SECRET_BYTES} bytes")
    return secret
