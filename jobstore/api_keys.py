"""API keys: stored only as SHA-256 hashes; a key's name is the owner of its jobs.

An admin key (`create_key(..., admin=True)`) also reaches the `/v1/admin` routes: the
overview of the deployment and every owner's jobs. Its own jobs stay its owner's."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import redis
import redis.asyncio as aredis

from jobs import keys
from jobstore.codec import text_map

KEY_PREFIX = "mmq_"


class KeyRecord(TypedDict):
    """What `keys.API_KEYS` keeps of a key (JSON), under its hash."""

    owner: str
    """Its name: the owner of its jobs."""
    created_at: float
    admin: NotRequired[bool]
    """Whether it also reaches the `/v1/admin` routes."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


OWNER_RULE = "a key name is 1-64 letters, digits, '-' or '_'"


def valid_owner(owner: str) -> bool:
    """Whether `owner` can name a key (`OWNER_RULE`)."""
    return 0 < len(owner) <= 64 and owner.replace("-", "").replace("_", "").isalnum()


def create_key(client: redis.Redis, owner: str, *, admin: bool = False) -> str:
    """Store the hash of a new key for `owner` and return the key (shown once); an
    `admin` key may also use the `/v1/admin` routes."""
    if not valid_owner(owner):
        raise ValueError(OWNER_RULE)
    key = new_key()
    record: KeyRecord = {"owner": owner, "created_at": time.time(), "admin": admin}
    client.hset(keys.API_KEYS, hash_key(key), json.dumps(record))
    return key


def revoke_owner(client: redis.Redis, owner: str) -> int:
    """Delete every key of `owner`, and the client secrets each made; returns how many."""
    stored = text_map(client.hgetall(keys.API_KEYS))
    gone = [h for h, rec in stored.items() if json.loads(rec)["owner"] == owner]
    if gone:
        client.hdel(keys.API_KEYS, *gone)
        _drop_secrets(client, gone)
    return len(gone)


def _drop_secrets(client: redis.Redis, hashed_keys: list[str]) -> None:
    """Delete the realtime client secrets that the keys made: a secret dies with its key
    (the API also checks the key when a secret is used, and open sessions watch it)."""
    for hashed in hashed_keys:
        index = keys.realtime_secrets_of(hashed)
        secrets_made = [str(s) for s in client.zrange(index, 0, -1)]
        client.delete(index, *[keys.realtime_secret(s) for s in secrets_made])


KEY_ID_CHARS = 12
"""A key's id: the start of its hash (never the key), as `mmq keys list` shows it."""


@dataclass(frozen=True)
class KeyInfo:
    id: str
    owner: str
    admin: bool
    created_at: float


def list_keys(client: redis.Redis) -> list[KeyInfo]:
    """Every key, by owner then age: its id, never the key."""
    stored = text_map(client.hgetall(keys.API_KEYS))
    found = [_info(hashed, json.loads(record)) for hashed, record in stored.items()]
    return sorted(found, key=lambda k: (k.owner, k.created_at))


def revoke_key(client: redis.Redis, key_id: str) -> KeyInfo | None:
    """Delete the one key whose id (or the start of it, at least 6 characters) is
    `key_id`; None when no key, or more than one, has it."""
    if len(key_id) < 6:
        return None
    stored = text_map(client.hgetall(keys.API_KEYS))
    matches = [hashed for hashed in stored if hashed.startswith(key_id)]
    if len(matches) != 1:
        return None
    (hashed,) = matches
    client.hdel(keys.API_KEYS, hashed)
    _drop_secrets(client, [hashed])
    return _info(hashed, json.loads(stored[hashed]))


def _info(hashed: str, record: KeyRecord) -> KeyInfo:
    created = record.get("created_at", 0)
    return KeyInfo(
        hashed[:KEY_ID_CHARS],
        str(record.get("owner", "")),
        bool(record.get("admin")),
        float(created) if isinstance(created, int | float) else 0.0,
    )


async def find_key(client: aredis.Redis, key: str) -> KeyRecord | None:
    """The stored record of `key`, None for a key not stored; read by the API
    (`api.callers`) for every request that sends one."""
    raw = await client.hget(keys.API_KEYS, hash_key(key))
    if raw is None:
        return None
    record: KeyRecord = json.loads(raw)
    return record


async def keys_present(client: aredis.Redis, hashed_keys: list[str]) -> list[bool]:
    """Whether each key (by its hash) is still stored, in one round trip: what open
    connections watch to end when their key is revoked (`api.key_watch`)."""
    if not hashed_keys:
        return []
    found = await client.hmget(keys.API_KEYS, hashed_keys)
    return [value is not None for value in found]


async def key_present(client: aredis.Redis, hashed: str) -> bool:
    """Whether the key whose hash is `hashed` is still stored."""
    return bool(await client.hexists(keys.API_KEYS, hashed))


async def owner_has_key(client: aredis.Redis, owner: str) -> bool:
    """Whether some stored key names `owner` (an admin's look-up: it reads every key)."""
    stored = text_map(await client.hgetall(keys.API_KEYS))
    return any(json.loads(record).get("owner") == owner for record in stored.values())
