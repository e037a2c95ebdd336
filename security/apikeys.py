"""API keys: stored only as SHA-256 hashes; a key's name is the owner of its jobs.

An admin key (`create_key(..., admin=True)`) also reaches the `/v1/admin` routes: the
overview of the deployment and every owner's jobs. Its own jobs stay its owner's."""

from __future__ import annotations

import hashlib
import json
import secrets
import time

import redis

from jobs import keys

KEY_PREFIX = "mmq_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_key(client: redis.Redis, owner: str, *, admin: bool = False) -> str:
    """Store the hash of a new key for `owner` and return the key (shown once); an
    `admin` key may also use the `/v1/admin` routes."""
    if not owner or len(owner) > 64 or not owner.replace("-", "").replace("_", "").isalnum():
        raise ValueError("a key name is 1-64 letters, digits, '-' or '_'")
    key = new_key()
    record = json.dumps({"owner": owner, "created_at": time.time(), "admin": admin})
    client.hset(keys.API_KEYS, hash_key(key), record)
    return key


def revoke_owner(client: redis.Redis, owner: str) -> int:
    """Delete every key of `owner`; returns how many."""
    gone = [
        h for h, rec in client.hgetall(keys.API_KEYS).items() if json.loads(rec)["owner"] == owner
    ]
    if gone:
        client.hdel(keys.API_KEYS, *gone)
    return len(gone)
