"""Bearer API keys as FastAPI dependencies: who the caller is (`api.callers`), the owner
of its jobs, admin routes. Each job belongs to the key's owner; other owners get 404
for it; a key that is not an admin's gets 403 on the admin routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from api import ratelimit
from api.callers import ApiKeys, Caller
from api.deps import get_state
from jobs.errors import Forbidden


async def get_api_keys(conn: HTTPConnection) -> ApiKeys:
    return get_state(conn).api_keys


async def current_caller(request: Request) -> Caller:
    """FastAPI dependency: who sent the request."""
    return await get_state(request).api_keys.caller_of(request.headers.get("authorization"))


async def current_owner(request: Request) -> str:
    """FastAPI dependency: the caller's owner id (and its requests quota's state, for the
    rate-limit headers of the paths that carry them)."""
    owner = (await current_caller(request)).owner
    # A submit learns the usage from its own script; other requests read it (one trip).
    if request.method != "POST" and ratelimit.watching():
        await get_state(request).service.note_usage(owner)
    return owner


async def current_admin(caller: Annotated[Caller, Depends(current_caller)]) -> Caller:
    """FastAPI dependency: the caller, who must hold an admin key (403 otherwise)."""
    if not caller.admin:
        raise Forbidden(f"the key of {caller.owner!r} is not an admin key; this route needs one")
    return caller


async def job_owner(
    request: Request, job_id: str, caller: Annotated[Caller, Depends(current_caller)]
) -> str:
    """FastAPI dependency of the routes of one job (`{job_id}` in the path): the owner
    the job is looked up as. The caller's own; for an admin, the job's (an admin may
    follow, cancel and retry any owner's job, as the console does)."""
    if caller.admin:
        owner = await get_state(request).service.owner_of(job_id)
        if owner is not None:
            return owner
    return caller.owner


Keys = Annotated[ApiKeys, Depends(get_api_keys)]
Owner = Annotated[str, Depends(current_owner)]
Admin = Annotated[Caller, Depends(current_admin)]
CurrentCaller = Annotated[Caller, Depends(current_caller)]
"""Who sent the request (solved once per request, whichever dependencies ask)."""
JobOwner = Annotated[str, Depends(job_owner)]
