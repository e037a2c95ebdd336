"""Secrets kept out of every log line, at every level, from every library.

A log record's text is checked as it is made (`logging.setLogRecordFactory`), so no
handler, formatter or logger configuration (uvicorn's, Celery's, a user's) can print a
secret: API keys (`mmq_...`, a `?token=` of a websocket or an EventSource, a bearer
token), signed URLs' signatures (mmq's and S3's presigned ones), webhook secrets
(`whsec_...`), passwords in URLs (`redis://:PASSWORD@host`) and in `password=` pairs,
and the exact secret values of the settings (`known_secrets`), whatever they look like.
A query value longer than 64 characters is cut there too (a client's input, repeated whole
by uvicorn's request lines, is no one's to write into the log).

A record whose text holds none is left as it was. One that does gets its arguments
cleaned where that is enough (uvicorn's access formatter reads them), else its message
is replaced by the cleaned text; a traceback is cleaned the same way.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from jobs.settings import Settings

MASK = "***"
MIN_SECRET_CHARS = 8
"""Shorter configured values are not searched for (they would mask ordinary words)."""

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # Query parameters that carry a credential: ?token=, signed URLs, S3 presigning.
    (
        re.compile(
            r"(?i)([?&;](?:token|access_token|api[_-]?key|key|signature|sig"
            r"|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&\s\"'<>]+"
        ),
        rf"\1{MASK}",
    ),
    (re.compile(r"mmq_[A-Za-z0-9_-]{8,}"), f"mmq_{MASK}"),
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), f"whsec_{MASK}"),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), rf"\1 {MASK}"),
    # scheme://user:password@host
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@"), rf"\1{MASK}@"),
    (re.compile(r"(?i)(password['\"]?\s*[=:]\s*['\"]?)[^'\"\s,&;)}]+"), rf"\1{MASK}"),
    # Not a secret, but a client's: a query value past 64 characters (a 5,000-character
    # `?after=`) is cut, so that a log line never repeats a long input whole.
    (re.compile(r"([?&;][^=&\s\"'<>]{1,64}=[^&\s\"'<>]{64})[^&\s\"'<>]+"), r"\1…"),
]


class Redactor:
    """Masks what looks like a secret, and the `known` secret values, in a text."""

    def __init__(self, known: Iterable[str] = ()) -> None:
        self.known: set[str] = set()
        self.add(known)

    def add(self, secrets: Iterable[str]) -> None:
        self.known |= {s for s in secrets if len(s) >= MIN_SECRET_CHARS}
        # Longest first: a secret that holds another is masked whole.
        self._known_sorted = sorted(self.known, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._known_sorted:
            if secret in text:
                text = text.replace(secret, MASK)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(replacement, text)
        return text


def known_secrets(settings: Settings) -> list[str]:
    """The secret values this process's settings and environment hold."""
    found = []
    if settings.redis_url:
        parts = urlsplit(settings.redis_url)
        found += [parts.password or "", *parse_qs(parts.query).get("sentinel_password", [])]
    if settings.webhooks.secret:
        found.append(settings.webhooks.secret)
    if settings.storage.signing_secret is not None:
        found.append(settings.storage.signing_secret.get_secret_value())
    found += [os.environ.get(name, "") for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
    return [unquote(value) for value in found if value] + [value for value in found if value]


_redactor = Redactor()


def redact(text: str) -> str:
    """`text` with the secrets this process knows of, and what looks like one, masked."""
    return _redactor(text)


def install(secrets: Iterable[str] = ()) -> None:
    """Check every log record of this process from now on; `secrets` are values to mask
    wherever they appear (more may be added by calling it again)."""
    _redactor.add(secrets)
    factory = logging.getLogRecordFactory()
    if getattr(factory, "redacts", False):
        return
    make: Callable[..., logging.LogRecord] = factory

    def redacting(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        clean(record)
        return record

    redacting.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting)


def clean(record: logging.LogRecord) -> None:
    """Mask the secrets in `record`'s message, arguments and traceback, in place."""
    try:
        message = record.getMessage()
    except Exception:  # bad arguments: logging reports it as it always has
        return
    masked = _redactor(message)
    if masked != message:
        _set_message(record, masked)
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = _redactor(text)
    if record.stack_info:
        record.stack_info = _redactor(record.stack_info)


def _set_message(record: logging.LogRecord, masked: str) -> None:
    """Keep the template and clean the arguments where that gives the masked text (a
    formatter may read the arguments), else the masked text with no arguments."""
    if isinstance(record.msg, str) and isinstance(record.args, tuple):
        args = tuple(_redactor(a) if isinstance(a, str) else a for a in record.args)
        try:
            if _redactor(record.msg) == record.msg and record.msg % args == masked:
                record.args = args
                return
        except (TypeError, ValueError):
            pass
    record.msg = masked
    record.args = ()
