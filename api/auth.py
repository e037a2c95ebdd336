"""Bearer API keys. Each job belongs to the key's owner; other owners get 404 for it.

An admin key (`jobs.apikeys.create_key(..., admin=True)`) may also use the `/v1/admin`
routes; any other key gets 403 there. With auth off (loopback only) the anonymous caller
is an admin: whoever can reach the port owns the whole deployment anyway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import redis.asyncio as aredis
from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from api.deps import get_state
from jobs import keys
from jobs.apikeys import hash_key
from jobs.errors import Forbidden, Unauthorized
from jobs.settings import Settings

ANONYMOUS_OWNER = "local"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the owner of its jobs, and whether it may use admin routes."""

    owner: str
    admin: bool


class ApiKeys:
    """Reads the keys that `mmq keys` stores (as SHA-256 hashes) to name the caller."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._r = client
        self._required = settings.auth.required

    async def caller_of(self, authorization: str | None) -> Caller:
        """The caller that `Authorization` names; the anonymous admin `local` when auth is
        off and the key is missing or unknown (a known key still scopes jobs to its
        owner, and is an admin only if it was made one)."""
        anonymous = Caller(ANONYMOUS_OWNER, admin=True)
        if not authorization:
            if self._required:
                raise Unauthorized("missing API key: send Authorization: Bearer <key>")
            return anonymous
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <key>'")
        record = await self._r.hget(keys.API_KEYS, hash_key(token.strip()))
        if record is None:
            if self._required:
                raise Unauthorized("unknown API key")
            # Auth off (loopback only): clients that always send some key (the openai
            # client does) act as the anonymous owner, as vLLM without --api-key does.
            return anonymous
        fields = json.loads(record)
        return Caller(str(fields["owner"]), admin=bool(fields.get("admin", False)))

    async def owner_of(self, authorization: str | None) -> str:
        """The owner that `Authorization` names (see `caller_of`)."""
        return (await self.caller_of(authorization)).owner


async def get_api_keys(conn: HTTPConnection) -> ApiKeys:
    return get_state(conn).api_keys


async def current_caller(request: Request) -> Caller:
    """FastAPI dependency: who sent the request."""
    return await get_state(request).api_keys.caller_of(request.headers.get("authorization"))


async def current_owner(request: Request) -> str:
    """FastAPI dependency: the caller's owner id."""
    return (await current_caller(request)).owner


async def current_admin(caller: Annotated[Caller, Depends(current_caller)]) -> Caller:
    """FastAPI dependency: the caller, who must hold an admin key (403 otherwise)."""
    if not caller.admin:
        raise Forbidden(f"the key of {caller.owner!r} is not an admin key; this route needs one")
    return caller


async def job_owner(request: Request, job_id: str) -> str:
    """FastAPI dependency of the routes of one job (`{job_id}` in the path): the owner
    the job is looked up as. The caller's own; for an admin, the job's (an admin may
    follow, cancel and retry any owner's job, as the console does)."""
    caller = await current_caller(request)
    if caller.admin:
        owner = await get_state(request).service.owner_of(job_id)
        if owner is not None:
            return owner
    return caller.owner


Keys = Annotated[ApiKeys, Depends(get_api_keys)]
Owner = Annotated[str, Depends(current_owner)]
Admin = Annotated[Caller, Depends(current_admin)]
JobOwner = Annotated[str, Depends(job_owner)]
