"""Realtime sessions in Redis: client secrets, the cap of concurrent sessions per owner
(holds that free themselves when their holder dies), and session event logs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aredis
from pydantic import JsonValue

from jobs import keys
from jobstore.realtime_sessions import AsyncRealtimeSessions, LogBudget

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
