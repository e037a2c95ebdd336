"""Issue 65 in the store: a client secret dies with its key; a key holds a capped number of
live secrets; a session's stored events are bounded in bytes per session and per owner,
and counted (real Redis)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
import redis
import redis.asyncio as aredis

from jobs import keys
from jobstore.api_keys import create_key, hash_key, revoke_key, revoke_owner
from jobstore.realtime_sessions import AsyncRealtimeSessions, LogBudget, TooManySecrets

pytestmark = pytest.mark.anyio


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def store(client: aredis.Redis) -> AsyncRealtimeSessions:
    return AsyncRealtimeSessions(client)


def unique(what: str) -> str:
    return f"{what}_{uuid.uuid4().hex[:12]}"


async def test_a_secret_dies_with_its_key(
    store: AsyncRealtimeSessions, rclient: redis.Redis
) -> None:
    owner = unique("owner")
    key = create_key(rclient, owner)
    other = create_key(rclient, owner)
    mine, _ = await store.create_secret(owner, hash_key(key), {}, ttl_s=600)
    theirs, _ = await store.create_secret(owner, hash_key(other), {}, ttl_s=600)
    assert await store.resolve_secret(mine) == (owner, hash_key(key), {})
    assert revoke_key(rclient, hash_key(key)[:12]) is not None
    assert await store.resolve_secret(mine) is None
    assert await store.resolve_secret(theirs) is not None  # the owner's other key lives
    assert revoke_owner(rclient, owner) == 1
    assert await store.resolve_secret(theirs) is None
    assert not rclient.exists(keys.realtime_secrets_of(hash_key(other)))


async def test_a_secret_whose_key_went_by_other_means_is_refused(
    store: AsyncRealtimeSessions, rclient: redis.Redis
) -> None:
    owner = unique("owner")
    key = create_key(rclient, owner)
    value, _ = await store.create_secret(owner, hash_key(key), {}, ttl_s=600)
    rclient.hdel(keys.API_KEYS, hash_key(key))  # not through revoke: the secret is kept
    assert await store.resolve_secret(value) is None


async def test_a_key_holds_a_capped_number_of_live_secrets(store: AsyncRealtimeSessions) -> None:
    owner, key_id = unique("owner"), unique("key")
    for _ in range(3):
        await store.create_secret(owner, key_id, {}, ttl_s=600, limit=3)
    with pytest.raises(TooManySecrets) as over:
        await store.create_secret(owner, key_id, {}, ttl_s=600, limit=3)
    assert 500 < over.value.retry_after_s <= 600
    # Another key of the same owner, and a caller without a key, have their own.
    await store.create_secret(owner, unique("key"), {}, ttl_s=600, limit=3)
    await store.create_secret(owner, None, {}, ttl_s=600, limit=3)


async def test_a_sessions_log_is_bounded_in_bytes_and_ends_with_a_marker(
    store: AsyncRealtimeSessions,
) -> None:
    owner, session_id = unique("owner"), unique("sess")
    budget = LogBudget(ttl_s=120, session_bytes=10_000, owner_bytes=1 << 20)
    event = json.dumps({"type": "x", "pad": "a" * 990})  # 1,011 bytes
    ids = await store.append(session_id, owner, [event] * 30, budget)
    stored = await store.events(session_id)
    assert sum(i is not None for i in ids) == 9
    assert json.loads(stored[-1][1])["type"] == "mmq.log_truncated"
    assert len(stored) == 10
    assert await store.owner_log_bytes(owner) <= 10_000
    assert await store.append(session_id, owner, [event], budget) == [None]
    assert len(await store.events(session_id)) == 10  # one marker, once


async def test_an_owners_logs_are_bounded_together_and_counted(
    store: AsyncRealtimeSessions,
) -> None:
    owner = unique("owner")
    budget = LogBudget(ttl_s=120, session_bytes=1 << 20, owner_bytes=35_000)
    before = await store.log_bytes()
    event = json.dumps({"type": "x", "pad": "a" * 9_990})
    first, second, third = unique("sess"), unique("sess"), unique("sess")
    assert None not in await store.append(first, owner, [event, event], budget)
    assert await store.append(second, owner, [event, event], budget) == [
        (await store.events(second))[0][0],
        None,
    ]
    assert await store.append(third, owner, [event], budget) == [None]
    assert 30_000 < await store.owner_log_bytes(owner) <= 35_000
    assert 30_000 < await store.log_bytes() - before <= 35_000
    # Another owner is not held back by this one.
    assert None not in await store.append(unique("sess"), unique("owner"), [event], budget)


async def test_an_expired_logs_bytes_are_freed(store: AsyncRealtimeSessions) -> None:
    owner = unique("owner")
    budget = LogBudget(ttl_s=1, session_bytes=1 << 20, owner_bytes=15_000)
    event = json.dumps({"type": "x", "pad": "a" * 9_990})
    assert None not in await store.append(unique("sess"), owner, [event], budget)
    assert await store.append(unique("sess"), owner, [event], budget) == [None]
    await anyio.sleep(1.2)
    await store.log_bytes()  # a scrape forgets the expired log
    assert await store.owner_log_bytes(owner) == 0
    assert None not in await store.append(unique("sess"), owner, [event], budget)


async def test_a_secret_stored_without_its_key_is_refused(
    store: AsyncRealtimeSessions, client: aredis.Redis
) -> None:
    """A record from before secrets named their key cannot be checked against revocation."""
    value = "ek_" + uuid.uuid4().hex
    legacy = json.dumps({"owner": unique("owner"), "session": {}})
    await client.set(keys.realtime_secret(hash_key(value)), legacy, ex=60)
    assert await store.resolve_secret(value) is None
