"""API keys: stored only as SHA-256 hashes; a key's name is the owner of its jobs."""

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


def create_key(client: redis.Redis, owner: str) -> str:
    """Store the hash of a new key for `owner` and return the key (shown once)."""
    if not owner or len(owner) > 64 or not owner.replace("-", "").replace("_", "").isalnum():
        raise ValueError("a key name is 1-64 letters, digits, '-' or '_'")
    key = new_key()
    record = json.dumps({"owner": owner, "created_at": time.time()})
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
