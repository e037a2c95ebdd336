"""Bearer API keys. Each job belongs to the key's owner; other owners get 404 for it."""

from __future__ import annotations

import json

from fastapi import Request

from api.deps import AppState, get_state
from jobs import keys
from jobs.apikeys import hash_key
from jobs.errors import Unauthorized

ANONYMOUS_OWNER = "local"


async def owner_from_key(state: AppState, authorization: str | None) -> str:
    """The owner that `Authorization` names; `local` when auth is off and the key is
    missing or unknown (a known key still scopes jobs to its owner)."""
    if not authorization:
        if state.settings.auth.required:
            raise Unauthorized("missing API key: send Authorization: Bearer <key>")
        return ANONYMOUS_OWNER
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("Authorization must be 'Bearer <key>'")
    record = await state.redis.hget(keys.API_KEYS, hash_key(token.strip()))
    if record is None:
        if state.settings.auth.required:
            raise Unauthorized("unknown API key")
        # Auth off (loopback only): clients that always send some key (the openai
        # client does) act as the anonymous owner, as vLLM without --api-key does.
        return ANONYMOUS_OWNER
    return str(json.loads(record)["owner"])


async def current_owner(request: Request) -> str:
    """FastAPI dependency: the caller's owner id."""
    return await owner_from_key(get_state(request), request.headers.get("authorization"))
