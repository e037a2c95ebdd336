"""Realtime voice sessions in Redis (OpenAI's Realtime API, issue 52): the ephemeral client
secrets that browsers connect with (`keys.realtime_secret`, stored only as SHA-256 hashes,
as API keys are), each owner's open sessions under its cap (`keys.owner_realtime`, scored
by when each hold runs out on Redis's clock, so that a session whose API process died
frees its slot without a word), and each session's replayable event log
(`keys.realtime_events`) with its record (`keys.realtime_session`)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import TypedDict, cast

import redis.asyncio as aredis
from pydantic import JsonValue

from jobs import keys
from jobstore.api_keys import hash_key
from jobstore.codec import dumps, time_seconds
from jobstore.metric_counts import queue_samples
from telemetry.metric_defs import Sample

SECRET_PREFIX = "ek_"

EVENT_FIELD = "data"
"""The stream field that holds an event's JSON, as in a job's event stream."""

# Holds are scored by Redis's time, never an API host's: a host whose clock is off must
# not free another's slot early (leases are measured the same way, `jobstore.lua`).
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

_HOLD = """
-- Holds the session's slot until now + ttl_s; the owner's set expires with its last hold.
local until_s = now + a.ttl_s
redis.call('ZADD', KEYS[1], until_s, a.session_id)
redis.call('ZADD', KEYS[2], until_s, a.session_id)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000) + 1000)
return 1
"""

OPEN = (
    _NOW
    + """
-- KEYS: the owner's open sessions, every owner's open sessions
-- ARGV[1]: JSON {session_id, limit (0: none), ttl_s}
-- Drops the holds that ran out; takes a slot for the session if fewer than `limit` are
-- held (a session that holds one already keeps it, renewed). The owner's set expires
-- with its last hold. Returns 1, or 0 where the owner is at its limit.
local a = cjson.decode(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], a.session_id)
if not held and a.limit > 0 and redis.call('ZCARD', KEYS[1]) >= a.limit then return 0 end
"""
    + _HOLD
)

RENEW = (
    _NOW
    + """
-- KEYS: the owner's open sessions, every owner's open sessions
-- ARGV[1]: JSON {session_id, ttl_s}
-- Extends the session's hold to now + ttl_s. A hold that ran out is not taken back
-- (the slot may be another's now). Returns 1, or 0 where the session holds no slot.
local a = cjson.decode(ARGV[1])
local held = redis.call('ZSCORE', KEYS[1], a.session_id)
if not held or tonumber(held) <= now then
  redis.call('ZREM', KEYS[1], a.session_id)
  redis.call('ZREM', KEYS[2], a.session_id)
  return 0
end
"""
    + _HOLD
)

LIVE = (
    _NOW
    + """
-- KEYS: a set of holds; returns how many have not run out
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""
)


class SecretRecord(TypedDict):
    """What `keys.realtime_secret` keeps of a client secret (JSON)."""

    owner: str
    session: dict[str, JsonValue]
    """The session configuration that the secret was made with."""


class AsyncRealtimeSessions:
    """Client secrets, concurrent sessions per owner and session event logs, for the
    API's `/v1/realtime` routes. A session id is unique across owners (the API makes it):
    the logs and `keys.REALTIME_LIVE` know sessions by it alone."""

    def __init__(self, client: aredis.Redis) -> None:
        self.r = client
        self._open = client.register_script(OPEN)
        self._renew = client.register_script(RENEW)
        self._live = client.register_script(LIVE)

    async def create_secret(
        self, owner: str, session: dict[str, JsonValue], ttl_s: int
    ) -> tuple[str, int]:
        """A new client secret for `owner` with its session configuration, kept `ttl_s`:
        the secret (shown once) and when it expires (unix seconds, Redis's clock)."""
        if ttl_s < 1:
            raise ValueError("a client secret lives at least 1 s")
        value = SECRET_PREFIX + secrets.token_urlsafe(24)
        record: SecretRecord = {"owner": owner, "session": session}
        pipe = self.r.pipeline(transaction=False)
        pipe.time()
        pipe.set(keys.realtime_secret(hash_key(value)), dumps(record), ex=ttl_s)
        now, _ = await pipe.execute()
        return value, int(time_seconds(now)) + ttl_s

    async def resolve_secret(self, value: str) -> tuple[str, dict[str, JsonValue]] | None:
        """The owner and session configuration of a client secret; None for one unknown
        or expired."""
        raw = await self.r.get(keys.realtime_secret(hash_key(value)))
        if raw is None:
            return None
        record = cast(SecretRecord, json.loads(raw))
        return record["owner"], record["session"]

    async def open(self, owner: str, session_id: str, limit: int, ttl_s: float) -> bool:
        """Take one of `owner`'s `limit` session slots (0: no cap) for `ttl_s` unless
        renewed; False where all are held. Opening a session that holds one renews it."""
        arg = dumps({"session_id": session_id, "limit": limit, "ttl_s": ttl_s})
        return bool(
            await self._open(keys=[keys.owner_realtime(owner), keys.REALTIME_LIVE], args=[arg])
        )

    async def renew(self, owner: str, session_id: str, ttl_s: float) -> bool:
        """Hold the session's slot `ttl_s` from now; False where its hold had run out (it
        holds none now: `open` it again)."""
        arg = dumps({"session_id": session_id, "ttl_s": ttl_s})
        return bool(
            await self._renew(keys=[keys.owner_realtime(owner), keys.REALTIME_LIVE], args=[arg])
        )

    async def close(self, owner: str, session_id: str) -> None:
        """Free the session's slot now."""
        pipe = self.r.pipeline(transaction=True)
        pipe.zrem(keys.owner_realtime(owner), session_id)
        pipe.zrem(keys.REALTIME_LIVE, session_id)
        await pipe.execute()

    async def count(self, owner: str) -> int:
        """How many sessions `owner` holds now."""
        return int(await self._live(keys=[keys.owner_realtime(owner)]))

    async def live_total(self) -> int:
        """How many sessions every owner holds now (the `/metrics` gauge)."""
        return int(await self._live(keys=[keys.REALTIME_LIVE]))

    async def append(
        self,
        session_id: str,
        owner: str,
        events: Sequence[str],
        ttl_s: int,
        max_len: int = 20000,
    ) -> list[str]:
        """Append events (JSON text each) to the session's log, capped near `max_len`, in
        one round trip; the log and the session's record are kept `ttl_s` from now.
        Returns the events' stream ids."""
        stream, record = keys.realtime_events(session_id), keys.realtime_session(session_id)
        pipe = self.r.pipeline(transaction=True)
        for event in events:
            pipe.xadd(stream, {EVENT_FIELD: event}, maxlen=max_len, approximate=True)
        pipe.hsetnx(record, "owner", owner)
        pipe.hsetnx(record, "created_at", repr(time.time()))
        pipe.expire(stream, ttl_s)
        pipe.expire(record, ttl_s)
        replies = await pipe.execute()
        return [str(entry_id) for entry_id in replies[: len(events)]]

    async def events(
        self, session_id: str, after: str | None = None, count: int = 1000
    ) -> list[tuple[str, str]]:
        """Up to `count` of the session's events after the id `after` (from the start
        where None), in order: (stream id, JSON)."""
        start = f"({after}" if after else "-"
        entries = cast(
            list[tuple[str, dict[str, str]]],
            await self.r.xrange(keys.realtime_events(session_id), start, count=count),
        )
        return [(entry_id, fields[EVENT_FIELD]) for entry_id, fields in entries]

    async def owner_of(self, session_id: str) -> str | None:
        """The owner of a session whose record is kept; None for one unknown or expired."""
        return cast(str | None, await self.r.hget(keys.realtime_session(session_id), "owner"))

    async def observe(self, samples: Iterable[Sample]) -> None:
        """Count a turn's samples (`telemetry.metric_defs.turn_samples`) in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        queue_samples(pipe, samples)
        await pipe.execute()
