"""The keys that `mmq keys` stores, read to name who sent a request.

An admin key (`jobstore.api_keys.create_key(..., admin=True)`) may also use the `/v1/admin`
routes; any other key gets 403 there. With auth off (loopback only) the anonymous caller
is an admin: whoever can reach the port owns the whole deployment anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aredis

from api.key_watch import KeyWatch
from jobs.errors import InputError, NotFound, Unauthorized
from jobs.settings import Settings
from jobstore.api_keys import (
    KEY_PREFIX,
    OWNER_RULE,
    find_key,
    hash_key,
    owner_has_key,
    valid_owner,
)
from security.echo import clip

ANONYMOUS_OWNER = "local"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the owner of its jobs, and whether it may use admin routes."""

    owner: str
    admin: bool
    key_id: str | None = None
    """The SHA-256 of the key it sent (None without one): what its long-lived connections
    watch, so that they end when the key is revoked (`api.key_watch`)."""


class ApiKeys:
    """Reads the keys that `mmq keys` stores (as SHA-256 hashes) to name the caller."""

    def __init__(self, client: aredis.Redis, settings: Settings) -> None:
        self._r = client
        self._required = settings.auth.required
        self.watch = KeyWatch(client, settings.auth.revocation_check_s)
        """The keys of this process's long-lived connections, which end when theirs goes."""

    async def caller_of(self, authorization: str | None) -> Caller:
        """The caller that `Authorization` names; the anonymous admin `local` when auth is
        off and no key is sent, or a token that is no mmq key (`EMPTY`, `sk-...`: what
        clients that always send one send). An mmq key (`mmq_...`) that is not known is
        refused whatever the setting: a mistyped key never files jobs as someone else. A
        known key still scopes jobs to its owner, and is an admin only if made one."""
        anonymous = Caller(ANONYMOUS_OWNER, admin=True)
        if not authorization:
            if self._required:
                raise Unauthorized("missing API key: send Authorization: Bearer <key>")
            return anonymous
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must be 'Bearer <key>'")
        fields = await find_key(self._r, token.strip())
        if fields is None:
            if self._required or token.strip().startswith(KEY_PREFIX):
                raise Unauthorized("unknown API key")
            # Auth off (loopback only): clients that always send some key (the openai
            # client does) act as the anonymous owner, as vLLM without --api-key does.
            return anonymous
        owner, admin = str(fields["owner"]), bool(fields.get("admin", False))
        return Caller(owner, admin=admin, key_id=hash_key(token.strip()))

    async def check_owner(self, owner: str) -> None:
        """`owner` names a key (InputError for a name no key can have, NotFound for one
        that no key has); the anonymous owner counts while auth is off."""
        if not valid_owner(owner):
            raise InputError("owner", f"{clip(owner)}: {OWNER_RULE}")
        if owner == ANONYMOUS_OWNER and not self._required:
            return
        if not await owner_has_key(self._r, owner):
            raise NotFound(f"no key is named {owner!r}")

    async def owner_of(self, authorization: str | None) -> str:
        """The owner that `Authorization` names (see `caller_of`)."""
        return (await self.caller_of(authorization)).owner
