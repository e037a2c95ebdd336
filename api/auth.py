"""Bearer API keys. Each job belongs to the key's owner; other owners get 404 for it."""

from __future__ import annotations

import json
from typing import Annotated

import redis.asyncio as aredis
from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from api.deps import get_state
from jobs import keys
from jobs.apikeys import hash_key
from jobs.errors import Unauthorized
from jobs.settings import Settings

ANONYMOUS_OWNER = "local"


class ApiKeys:
    """Reads the keys that `mmq keys` stores (as SHA-256 hashes) to name the caller."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._r = client
        self._required = settings.auth.required

    async def owner_of(self, authorization: str | None) -> str:
        """The owner that `Authorization` names; `local` when auth is off and the key is
        missing or unknown (a known key still scopes jobs to its owner)."""
        if not authorization:
            if self._required:
                raise Unauthorized("missing API key: send Authorization: Bearer <key>")
            return ANONYMOUS_OWNER
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <key>'")
        record = await self._r.hget(keys.API_KEYS, hash_key(token.strip()))
        if record is None:
            if self._required:
                raise Unauthorized("unknown API key")
            # Auth off (loopback only): clients that always send some key (the openai
            # client does) act as the anonymous owner, as vLLM without --api-key does.
            return ANONYMOUS_OWNER
        return str(json.loads(record)["owner"])


async def get_api_keys(conn: HTTPConnection) -> ApiKeys:
    return get_state(conn).api_keys


async def current_owner(request: Request) -> str:
    """FastAPI dependency: the caller's owner id."""
    return await get_state(request).api_keys.owner_of(request.headers.get("authorization"))


Keys = Annotated[ApiKeys, Depends(get_api_keys)]
Owner = Annotated[str, Depends(current_owner)]
