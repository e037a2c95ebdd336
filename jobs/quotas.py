"""What one API key may use: jobs queued at once and jobs submitted per window, over
the deployment's `quotas` defaults (0: no limit).

The limits are checked, and the usage counted, in the script that stores a job
(`jobs.lua.SUBMIT`): concurrent submits can never go past a limit. The transition script
gives a queued slot back whenever a job leaves `queued` (started, canceled, expired),
and takes one again when the reaper queues a lost job again. Batch lines count apart
(the release stage bounds them).
"""

from __future__ import annotations

from typing import Any

import redis
from pydantic import BaseModel, Field

from jobs import keys
from jobs.codec import dumps
from jobs.settings import QuotaSettings


class KeyLimits(BaseModel):
    """A key's own limits (None: the deployment's default)."""

    max_queued: int | None = Field(default=None, ge=0)
    requests: int | None = Field(default=None, ge=0)
    weight: float | None = Field(default=None, gt=0, le=1000)
    """Its share under fair share, against other keys' (1 by default)."""


class Quota(BaseModel):
    """A key's limits in effect, and what it uses now."""

    owner: str = ""
    """Whose (in lists of several keys)."""
    max_queued: int
    """0: no limit."""
    requests: int
    """Jobs per `window_s`; 0: no limit."""
    window_s: int
    queued: int
    """Its jobs queued now."""
    requests_used: int
    """Jobs it submitted in this window."""


def effective(
    defaults: QuotaSettings, own: dict[str, Any], queued: int, used: int, owner: str = ""
) -> Quota:
    return Quota(
        owner=owner,
        max_queued=int(own.get("max_queued", defaults.max_queued)),
        requests=int(own.get("requests", defaults.requests)),
        window_s=defaults.window_s,
        queued=queued,
        requests_used=used,
    )


def own_fields(limits: KeyLimits) -> str | None:
    """The JSON kept for a key's own limits; None when it has none (the defaults)."""
    values = limits.model_dump(exclude_none=True)
    return dumps(values) if values else None


def set_limits(client: redis.Redis, owner: str, limits: KeyLimits) -> None:
    """Set (or, all None, clear) `owner`'s own limits; the next submit sees them."""
    fields = own_fields(limits)
    if fields is None:
        client.hdel(keys.LIMITS, owner)
    else:
        client.hset(keys.LIMITS, owner, fields)
