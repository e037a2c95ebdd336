"""Realtime sessions in Redis: client secrets, the cap of concurrent sessions per owner
(holds that free themselves when their holder dies), and session event logs; and issue 65's
bounds: a client secret dies with its key, a key holds a capped number of live secrets, and
a session's stored events are bounded in bytes per session and per owner, and counted."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
import redis
import redis.asyncio as aredis
from pydantic import JsonValue

from jobs import keys
from jobstore.api_keys import create_key, hash_key, revoke_key, revoke_owner
from jobstore.realtime_sessions import AsyncRealtimeSessions, LogBudget, TooManySecrets

pytestmark = pytest.mark.anyio
BUDGET = LogBudget(ttl_s=120, session_bytes=1 << 20, owner_bytes=1 << 20)


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


async def test_a_secret_resolves_to_its_owner_and_session(store: AsyncRealtimeSessions) -> None:
    owner = unique("owner")
    session: dict[str, JsonValue] = {"type": "realtime", "model": "voice", "voice": ["a", 1]}
    value, expires_at = await store.create_secret(owner, None, session, ttl_s=60)
    assert value.startswith("ek_")
    assert expires_at >= int(time.time()) + 55
    assert await store.resolve_secret(value) == (owner, None, session)
    assert await store.resolve_secret(value + "x") is None
    assert await store.resolve_secret("ek_" + uuid.uuid4().hex) is None


async def test_a_secret_is_stored_only_as_its_hash(
    store: AsyncRealtimeSessions, client: aredis.Redis
) -> None:
    value, _ = await store.create_secret(unique("owner"), None, {}, ttl_s=60)
    assert [k async for k in client.scan_iter(match=f"*{value}*")] == []


async def test_an_expired_secret_resolves_to_none(store: AsyncRealtimeSessions) -> None:
    value, _ = await store.create_secret(unique("owner"), None, {"model": "voice"}, ttl_s=1)
    assert await store.resolve_secret(value) is not None
    await anyio.sleep(1.2)
    assert await store.resolve_secret(value) is None


async def test_the_cap_refuses_a_third_session_until_one_closes(
    store: AsyncRealtimeSessions,
) -> None:
    owner = unique("owner")
    first, second, third = unique("sess"), unique("sess"), unique("sess")
    assert await store.open(owner, first, limit=2, ttl_s=30)
    assert await store.open(owner, second, limit=2, ttl_s=30)
    assert not await store.open(owner, third, limit=2, ttl_s=30)
    assert await store.open(owner, first, limit=2, ttl_s=30)  # held already: renewed
    assert await store.count(owner) == 2
    await store.close(owner, first)
    assert await store.count(owner) == 1
    assert await store.open(owner, third, limit=2, ttl_s=30)
    assert await store.count(owner) == 2


async def test_no_limit_means_no_cap(store: AsyncRealtimeSessions) -> None:
    owner = unique("owner")
    for _ in range(5):
        assert await store.open(owner, unique("sess"), limit=0, ttl_s=30)
    assert await store.count(owner) == 5


async def test_a_dead_holders_slot_frees_itself_and_a_renewed_one_stays(
    store: AsyncRealtimeSessions,
) -> None:
    owner = unique("owner")
    dead, alive, late = unique("sess"), unique("sess"), unique("sess")
    assert await store.open(owner, dead, limit=2, ttl_s=0.5)
    assert await store.open(owner, alive, limit=2, ttl_s=0.5)
    assert not await store.open(owner, late, limit=2, ttl_s=30)
    for _ in range(4):  # the live holder renews; the dead one does not
        await anyio.sleep(0.25)
        assert await store.renew(owner, alive, ttl_s=0.5)
    assert await store.count(owner) == 1
    assert not await store.renew(owner, dead, ttl_s=30)  # its hold ran out: not taken back
    assert await store.open(owner, late, limit=2, ttl_s=30)
    assert await store.count(owner) == 2
    assert not await store.open(owner, unique("sess"), limit=2, ttl_s=30)
    for session_id in (alive, late):  # no hold of this test runs out during another's
        await store.close(owner, session_id)


async def test_live_total_counts_every_owners_sessions(store: AsyncRealtimeSessions) -> None:
    """Every other test's short holds end with it, so the count before stays put."""
    before = await store.live_total()
    one, two = unique("owner"), unique("owner")
    short = unique("sess")
    assert await store.open(one, unique("sess"), limit=0, ttl_s=30)
    assert await store.open(one, short, limit=0, ttl_s=0.3)
    closed = unique("sess")
    assert await store.open(two, closed, limit=0, ttl_s=30)
    assert await store.open(two, unique("sess"), limit=0, ttl_s=30)
    assert await store.live_total() == before + 4
    await store.close(two, closed)
    assert await store.live_total() == before + 3
    await anyio.sleep(0.5)
    assert await store.live_total() == before + 2
    assert await store.count(one) == 1


async def test_events_round_trip_and_resume_after_an_id(
    store: AsyncRealtimeSessions, client: aredis.Redis
) -> None:
    owner, session_id = unique("owner"), unique("sess")
    assert await store.events(session_id) == []
    assert await store.owner_of(session_id) is None
    sent = [json.dumps({"type": "session.created", "n": n}) for n in range(3)]
    ids = await store.append(session_id, owner, sent[:2], BUDGET)
    ids += await store.append(session_id, owner, sent[2:], BUDGET)
    assert len(set(ids)) == 3
    assert await store.events(session_id) == list(zip(ids, sent, strict=True))
    assert await store.events(session_id, after=ids[0]) == list(zip(ids[1:], sent[1:], strict=True))
    assert await store.events(session_id, after=ids[2]) == []
    assert await store.events(session_id, count=2) == list(zip(ids[:2], sent[:2], strict=True))
    assert await store.owner_of(session_id) == owner
    for key in (keys.realtime_events(session_id), keys.realtime_session(session_id)):
        assert 0 < await client.ttl(key) <= 120


async def test_the_log_is_capped_near_max_len(
    store: AsyncRealtimeSessions, client: aredis.Redis
) -> None:
    session_id = unique("sess")
    events = [json.dumps({"n": n}) for n in range(500)]
    ids = await store.append(session_id, unique("owner"), events, BUDGET._replace(max_len=10))
    assert len(ids) == 500
    kept = await client.xlen(keys.realtime_events(session_id))
    assert kept < 500
    assert (await store.events(session_id))[-1] == (ids[-1], events[-1])


# -- issue 65: secrets die with their key; logs bounded in bytes ---------------------------


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


async def test_a_key_holds_a_capped_number_of_live_secrets(
    store: AsyncRealtimeSessions, client: aredis.Redis
) -> None:
    owner, key_id = unique("owner"), unique("key")
    expiries = [
        (await store.create_secret(owner, key_id, {}, ttl_s=600, limit=3))[1] for _ in range(3)
    ]
    with pytest.raises(TooManySecrets) as over:
        await store.create_secret(owner, key_id, {}, ttl_s=600, limit=3)
    seconds, _micros = await client.time()
    # Retry-After: until the oldest live secret expires (by Redis's clock), never past a TTL.
    assert min(expiries) - seconds <= over.value.retry_after_s <= 600
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
