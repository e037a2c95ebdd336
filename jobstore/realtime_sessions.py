"""Realtime voice sessions in Redis (OpenAI's Realtime API, issue 52): the ephemeral client
secrets that browsers connect with (`keys.realtime_secret`, stored only as SHA-256 hashes,
as API keys are), each owner's open sessions under its cap (`keys.owner_realtime`, scored
by when each hold runs out on Redis's clock, so that a session whose API process died
frees its slot without a word), and each session's replayable event log
(`keys.realtime_events`) with its record (`keys.realtime_session`)."""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple, NotRequired, TypedDict, cast

import redis.asyncio as aredis
from pydantic import JsonValue

from jobs import keys
from jobstore.api_keys import hash_key, key_present
from jobstore.codec import dumps
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


NEW_SECRET = (
    _NOW
    + """
-- KEYS: the key's secrets, the new secret
-- ARGV[1]: JSON {hash, record, ttl_s, limit (0: none)}
-- Drops the secrets that expired from the key's set; stores the new one unless `limit`
-- are live. Returns {1, expires at} or {0, seconds until the first expires}.
local a = cjson.decode(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if a.limit > 0 and redis.call('ZCARD', KEYS[1]) >= a.limit then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, tostring(tonumber(first[2]) - now)}
end
local until_s = now + a.ttl_s
redis.call('SET', KEYS[2], a.record, 'EX', a.ttl_s)
redis.call('ZADD', KEYS[1], until_s, a.hash)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) * 1000) + 1000)
return {1, tostring(until_s)}
"""
)

_PRUNE = """
-- Forgets the bytes of logs that expired, a hundred at a time (`counts`: the byte counts,
-- `expiries`: when each log expires, as `<session id>:<owner>`).
for _, member in ipairs(redis.call('ZRANGEBYSCORE', expiries, '-inf', now, 'LIMIT', 0, 100)) do
  local sid, owner = string.match(member, '^([^:]+):(.*)$')
  local n = tonumber(redis.call('HGET', counts, sid) or '0')
  redis.call('HDEL', counts, sid)
  if redis.call('HINCRBY', counts, 'owner:' .. owner, -n) <= 0 then
    redis.call('HDEL', counts, 'owner:' .. owner)
  end
  redis.call('HINCRBY', counts, 'total', -n)
  redis.call('ZREM', expiries, member)
end
"""

APPEND = (
    _NOW
    + "local counts, expiries = KEYS[3], KEYS[4]\n"
    + _PRUNE
    + """
-- KEYS: the session's events, its record, the byte counts, the logs' expiries
-- ARGV[1]: JSON {session_id, owner, events, marker, ttl_s, max_len, session_bytes,
--                owner_bytes, created_at}
-- Appends each event that fits the session's and the owner's byte budgets; the first
-- that does not is replaced by `marker`, once per session. The log and its record are
-- kept ttl_s from now. Returns each event's stream id (false: not stored).
local a = cjson.decode(ARGV[1])
local owner_field = 'owner:' .. a.owner
local in_session = tonumber(redis.call('HGET', KEYS[3], a.session_id) or '0')
local in_owner = tonumber(redis.call('HGET', KEYS[3], owner_field) or '0')
local added, ids = 0, {}
for i, text in ipairs(a.events) do
  local n = #text
  ids[i] = false
  if in_session + n <= a.session_bytes and in_owner + n <= a.owner_bytes then
    ids[i] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', a.max_len, '*', 'data', text)
  elseif redis.call('HSETNX', KEYS[2], 'truncated', '1') == 1 then
    n = #a.marker
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', a.max_len, '*', 'data', a.marker)
  else
    n = 0
  end
  in_session, in_owner, added = in_session + n, in_owner + n, added + n
end
if added > 0 then
  redis.call('HINCRBY', KEYS[3], a.session_id, added)
  redis.call('HINCRBY', KEYS[3], owner_field, added)
  redis.call('HINCRBY', KEYS[3], 'total', added)
end
redis.call('HSETNX', KEYS[2], 'owner', a.owner)
redis.call('HSETNX', KEYS[2], 'created_at', a.created_at)
redis.call('EXPIRE', KEYS[1], a.ttl_s)
redis.call('EXPIRE', KEYS[2], a.ttl_s)
redis.call('ZADD', KEYS[4], now + a.ttl_s, a.session_id .. ':' .. a.owner)
return ids
"""
)

LOG_BYTES = (
    _NOW
    + "local counts, expiries = KEYS[1], KEYS[2]\n"
    + _PRUNE
    + """
-- KEYS: the byte counts, the logs' expiries; returns the bytes that the kept logs hold
return tonumber(redis.call('HGET', counts, 'total') or '0')
"""
)


class SecretRecord(TypedDict):
    """What `keys.realtime_secret` keeps of a client secret (JSON)."""

    owner: str
    key: NotRequired[str | None]
    """The SHA-256 of the API key that made it (None without one): it dies with the key."""
    session: dict[str, JsonValue]
    """The session configuration that the secret was made with."""


class TooManySecrets(Exception):
    """The key holds its cap of live client secrets; one expires in `retry_after_s`."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(retry_after_s)
        self.retry_after_s = retry_after_s


class LogBudget(NamedTuple):
    """The bounds on what a session's stored events hold (`realtime.*` settings)."""

    ttl_s: int
    session_bytes: int
    owner_bytes: int
    max_len: int = 20000


class AsyncRealtimeSessions:
    """Client secrets, concurrent sessions per owner and session event logs, for the
    API's `/v1/realtime` routes. A session id is unique across owners (the API makes it):
    the logs and `keys.REALTIME_LIVE` know sessions by it alone."""

    def __init__(self, client: aredis.Redis) -> None:
        self.r = client
        self._open = client.register_script(OPEN)
        self._renew = client.register_script(RENEW)
        self._live = client.register_script(LIVE)
        self._new_secret = client.register_script(NEW_SECRET)
        self._append = client.register_script(APPEND)
        self._log_bytes = client.register_script(LOG_BYTES)

    async def create_secret(
        self,
        owner: str,
        key_id: str | None,
        session: dict[str, JsonValue],
        ttl_s: int,
        limit: int = 0,
    ) -> tuple[str, int]:
        """A new client secret for `owner` (acting for the key whose hash is `key_id`) with
        its session configuration, kept `ttl_s`: the secret (shown once) and when it
        expires (unix seconds, Redis's clock). TooManySecrets where the key holds `limit`
        live ones (0: no cap)."""
        if ttl_s < 1:
            raise ValueError("a client secret lives at least 1 s")
        value = SECRET_PREFIX + secrets.token_urlsafe(24)
        hashed = hash_key(value)
        record: SecretRecord = {"owner": owner, "key": key_id, "session": session}
        arg = {"hash": hashed, "record": dumps(record), "ttl_s": ttl_s, "limit": limit}
        made, at = await self._new_secret(
            keys=[
                keys.realtime_secrets_of(key_id or f"owner:{owner}"),
                keys.realtime_secret(hashed),
            ],
            args=[dumps(arg)],
        )
        if not int(made):
            raise TooManySecrets(max(1, math.ceil(float(at))))
        return value, int(float(at))

    async def resolve_secret(
        self, value: str
    ) -> tuple[str, str | None, dict[str, JsonValue]] | None:
        """The owner, key (its hash) and session configuration of a client secret; None
        for one unknown or expired, or whose key was revoked."""
        stored = keys.realtime_secret(hash_key(value))
        raw = await self.r.get(stored)
        if raw is None:
            return None
        record = cast(SecretRecord, json.loads(raw))
        if "key" not in record:  # made before secrets named their key: it cannot be checked
            return None
        key_id = record["key"]
        if key_id is not None and not await key_present(self.r, key_id):
            await self.r.delete(stored)
            return None
        return record["owner"], key_id, record["session"]

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
        self, session_id: str, owner: str, events: Sequence[str], budget: LogBudget
    ) -> list[str | None]:
        """Append events (JSON text each) to the session's log, capped near
        `budget.max_len` entries and by its bytes per session and per owner, in one round
        trip; the log and the session's record are kept `budget.ttl_s` from now. Returns
        the events' stream ids (None for one not stored: over a budget)."""
        arg = {
            "session_id": session_id,
            "owner": owner,
            "events": list(events),
            "marker": dumps({"type": "mmq.log_truncated", "event_id": None}),
            "ttl_s": budget.ttl_s,
            "max_len": budget.max_len,
            "session_bytes": budget.session_bytes,
            "owner_bytes": budget.owner_bytes,
            "created_at": repr(time.time()),
        }
        stream, record = keys.realtime_events(session_id), keys.realtime_session(session_id)
        ids = await self._append(
            keys=[stream, record, keys.REALTIME_LOG_BYTES, keys.REALTIME_LOG_EXPIRY],
            args=[dumps(arg)],
        )
        return [None if entry_id is None else str(entry_id) for entry_id in ids]

    async def log_bytes(self) -> int:
        """The bytes that every kept session log holds (the `/metrics` gauge)."""
        return int(await self._log_bytes(keys=[keys.REALTIME_LOG_BYTES, keys.REALTIME_LOG_EXPIRY]))

    async def owner_log_bytes(self, owner: str) -> int:
        """The bytes that `owner`'s kept session logs hold (expired ones may count until
        the next append or scrape meets them)."""
        found = await self.r.hget(keys.REALTIME_LOG_BYTES, f"owner:{owner}")
        return int(found or 0)

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
