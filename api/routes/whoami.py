"""`GET /v1/whoami`: who the key names, for clients such as the web console."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from api.auth import current_caller
from api.callers import Caller
from api.deps import Service
from jobstore.quotas import Quota

router = APIRouter(tags=["auth"], responses={401: {"description": "Missing or unknown key."}})


class Me(BaseModel):
    owner: str
    """The owner the key's jobs belong to (`local` without a key, auth off)."""
    admin: bool
    """Whether the key may use the `/v1/admin` routes (the overview, every owner's jobs)."""
    quota: Quota
    """Its limits in effect and what it uses now (its own only)."""


@router.get("/v1/whoami", response_model=Me)
async def whoami(caller: Annotated[Caller, Depends(current_caller)], service: Service) -> Me:
    """The caller's owner, whether it is an admin, and its quota and usage; 401 for a
    missing or unknown key where keys are required. Never shows the key itself."""
    quota = await service.quota(caller.owner)
    return Me(owner=caller.owner, admin=caller.admin, quota=quota)
