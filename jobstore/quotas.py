"""What one API key may use, over the deployment's `quotas` defaults (0: no limit): jobs
queued at once, jobs submitted per window, jobs released to the workers at once, and per
kind a cost per window.

The limits on queued jobs, requests and cost are checked, and the usage counted, in the
script that stores a job (`jobstore.lua.SUBMIT`): concurrent submits can never go past a
limit. The transition script gives a queued slot back whenever a job leaves `queued`
(started, canceled, expired), and takes one again when the reaper queues a lost job
again; it gives a released slot (`max_running`) back when a released job ends. Batch
lines count apart (the scheduler bounds them).

A job's cost is counted when it is admitted where its input tells it (`JobInput.cost`:
LLM tokens as OpenAI's rate limiter counts them, the prompt's estimate plus
`max_tokens`), and when it succeeds where only its output does (`JobInput.cost_after`:
ASR audio seconds). A key at or over its cost for the window is refused until the window
ends.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

import redis
from pydantic import BaseModel, Field, field_validator
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline

from jobs import keys
from jobs.settings import COST_UNITS, QuotaSettings, check_costs
from jobstore.codec import dumps

LIMIT_MAX = 2**53 - 1
"""The largest limit a key may be given: the scripts compare limits as Lua numbers
(doubles), exact up to this; a larger one is refused (422), never stored."""


class KeyLimits(BaseModel):
    """A key's own limits (None: the deployment's default)."""

    max_queued: int | None = Field(default=None, ge=0, le=LIMIT_MAX)
    requests: int | None = Field(default=None, ge=0, le=LIMIT_MAX)
    max_running: int | None = Field(default=None, ge=0, le=LIMIT_MAX)
    costs: dict[str, Annotated[int, Field(ge=0, le=LIMIT_MAX)]] | None = None
    """Per kind (`COST_UNITS`), cost per window; a kind named here replaces the
    deployment's default for it (0: no limit)."""
    weight: float | None = Field(default=None, gt=0, le=1000)
    """Its share under fair share, against other keys' (1 by default)."""

    @field_validator("costs")
    @classmethod
    def _known_kinds(cls, costs: dict[str, int] | None) -> dict[str, int] | None:
        return None if costs is None else check_costs(costs)


class OwnLimits(TypedDict, total=False):
    """A key's own limits as `keys.LIMITS` keeps them (JSON of `KeyLimits`, its unset
    fields left out), read by the submit script too."""

    max_queued: int
    requests: int
    max_running: int
    costs: dict[str, int]
    weight: float


class CostUse(BaseModel):
    unit: str
    limit: int
    """Per window; 0: no limit."""
    used: int
    """In this window."""


class Quota(BaseModel):
    """A key's limits in effect, and what it uses now."""

    owner: str = ""
    """Whose (in lists of several keys)."""
    max_queued: int
    """0: no limit."""
    requests: int
    """Jobs per `window_s`; 0: no limit."""
    max_running: int = 0
    """Jobs released to the workers at once; 0: no limit."""
    window_s: int
    queued: int
    """Its jobs queued now."""
    running: int = 0
    """Its jobs released to the workers now (running, or next in a queue)."""
    requests_used: int
    """Jobs it submitted in this window."""
    costs: dict[str, CostUse] = Field(default_factory=dict)
    """Per kind with a cost limit or a cost this window."""


def cost_limits(defaults: QuotaSettings, own: OwnLimits) -> dict[str, int]:
    """Per kind, the cost limit in effect (the key's own over the defaults)."""
    return {**defaults.costs, **(own.get("costs") or {})}


def reads(pipe: Pipeline | AsyncPipeline, owner: str, window: int) -> None:
    """Queue on a Redis pipeline (sync or async) what `from_reads` reads back."""
    pipe.hget(keys.LIMITS, owner)
    pipe.hmget(keys.usage(owner), ["queued", "running"])
    pipe.get(keys.requests_in(owner, window))
    for kind in COST_UNITS:
        pipe.get(keys.cost_in(owner, kind, window))


READS = 3 + len(COST_UNITS)
"""Replies that `reads` queues."""


def from_reads(defaults: QuotaSettings, found: list[Any], owner: str = "") -> Quota:
    own_raw, (queued, running), used, *costs = found
    own = _loads(own_raw) if own_raw else {}
    limits = cost_limits(defaults, own)
    spent = dict(zip(COST_UNITS, (int(c or 0) for c in costs), strict=True))
    return Quota(
        owner=owner,
        max_queued=int(own.get("max_queued", defaults.max_queued)),
        requests=int(own.get("requests", defaults.requests)),
        max_running=int(own.get("max_running", defaults.max_running)),
        window_s=defaults.window_s,
        queued=max(0, int(queued or 0)),
        running=max(0, int(running or 0)),
        requests_used=int(used or 0),
        costs={
            kind: CostUse(unit=unit, limit=int(limits.get(kind, 0)), used=spent[kind])
            for kind, unit in COST_UNITS.items()
            if limits.get(kind) or spent[kind]
        },
    )


def charge_after(
    owner: str, kind: str, cost: int, defaults: QuotaSettings, now: float
) -> tuple[str, int, int]:
    """What a job's end counts of a cost known only then (`Transition.charge`): in the
    window it ends in."""
    window = int(now // defaults.window_s)
    return keys.cost_in(owner, kind, window), cost, 2 * defaults.window_s


def own_fields(limits: KeyLimits) -> str | None:
    """The JSON kept for a key's own limits; None when it has none (the defaults)."""
    values = limits.model_dump(exclude_none=True)
    return dumps(values) if values else None


def get_limits(client: redis.Redis, owner: str) -> KeyLimits | None:
    """The owner's own limits, None where it has none set."""
    raw = client.hget(keys.LIMITS, owner)
    return KeyLimits.model_validate_json(raw) if raw else None


def set_limits(client: redis.Redis, owner: str, limits: KeyLimits) -> None:
    """Set (or, all None, clear) `owner`'s own limits; the next submit sees them."""
    fields = own_fields(limits)
    if fields is None:
        client.hdel(keys.LIMITS, owner)
    else:
        client.hset(keys.LIMITS, owner, fields)


def _loads(raw: str | bytes) -> OwnLimits:
    value: OwnLimits = json.loads(raw)
    return value if isinstance(value, dict) else {}
