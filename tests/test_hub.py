"""The API's event hub against real Redis: a request that waits needs the ends channel
alone; followers open the events channel, which closes after they leave, and reopens."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aredis

from api.hub import RESYNC, EventHub
from jobs import keys
from jobs.models import Event, EventType, Job
from jobs.settings import Settings
from jobs.states import JobStatus
from jobstore.changes import Lease, transition
from jobstore.codec import job_to_fields
from jobstore.store import JobStore

Notice = dict[str, Any]
T = TypeVar("T")
HUB_NAME = "test-hub"
RUNNING = frozenset({JobStatus.RUNNING})


@pytest.fixture
def store(redis_url: str) -> JobStore:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return JobStore(client, Settings(redis_url=redis_url))


def _put(store: JobStore) -> Job:
    now = time.time()
    job = Job(
        id=f"job_hub{time.monotonic_ns()}",
        kind="echo",
        pipeline="echo",
        status=JobStatus.QUEUED,
        owner="owner-hub",
        priority="normal",
        input={"text": "hi"},
        created_at=now,
        queued_at=now,
    )
    store.r.hset(keys.job(job.id), mapping=job_to_fields(job))
    return job


def _run_to_end(store: JobStore, job: Job) -> None:
    """A worker's writes for one job: start, one progress event, success."""
    lease = Lease("w", 5000)
    assert store.apply(transition(job, JobStatus.RUNNING, lease_mode="acquire", lease=lease)).ok
    store.append_event(job.id, EventType.PROGRESS, {"step": 1}, first_output=False)
    end = transition(job, JobStatus.SUCCEEDED, sources=RUNNING, lease_mode="check", lease=lease)
    assert store.apply(end).ok


async def _until(queue: asyncio.Queue[T], last: Callable[[T], bool]) -> list[T]:
    got: list[T] = []
    async with asyncio.timeout(5):
        while not got or not last(got[-1]):
            got.append(await queue.get())
    return got


def _marker(job_id: str) -> Notice:
    return {"job_id": job_id, "type": "marker"}


def _is_marker(notice: Notice) -> bool:
    return notice.get("type") == "marker"


def _succeeded(notice: Notice | Event) -> bool:
    data = notice.data if isinstance(notice, Event) else notice["data"]
    return bool(data.get("status") == "succeeded")


@asynccontextmanager
async def _hub(redis_url: str, linger_s: float) -> AsyncIterator[EventHub]:
    client = aredis.Redis.from_url(redis_url, decode_responses=True, client_name=HUB_NAME)
    hub = EventHub(client, events_linger_s=linger_s)
    await hub.start()
    try:
        yield hub
    finally:
        await hub.stop()
        await client.aclose()


def test_a_waiting_request_gets_the_end_with_the_job_and_nothing_else(
    redis_url: str, store: JobStore
) -> None:
    async def main() -> list[Notice]:
        async with _hub(redis_url, 0.2) as hub:
            job = _put(store)
            async with hub.subscribe_ends(job.id) as queue:
                assert not hub.following  # nobody follows events: that channel is shut
                await asyncio.to_thread(_run_to_end, store, job)
                got = await _until(queue, _succeeded)
                # A marker sent after the job's writes, on the same channel, comes after
                # anything they published there: nothing came between the end and it.
                store.r.publish(keys.ENDS_CHANNEL, json.dumps(_marker(job.id)))
                assert await _until(queue, _is_marker) == [_marker(job.id)]
                assert not hub.following
                return got

    [end] = asyncio.run(main())  # the queued, running and progress notices never came
    assert end["type"] == "status" and end["data"] == {"status": "succeeded"}
    assert end["job"]["status"] == "succeeded" and end["job"]["owner"] == "owner-hub"


def test_followers_open_the_events_channel_until_the_last_leaves(
    redis_url: str, store: JobStore
) -> None:
    async def follow_one(hub: EventHub) -> list[Event]:
        job = _put(store)
        async with hub.subscribe(job.id) as queue, hub.subscribe_ends(job.id) as end:
            assert hub.following
            await asyncio.to_thread(_run_to_end, store, job)
            events = await _until(queue, _succeeded)
            assert "job" in (await _until(end, _succeeded))[0]
            return [e for e in events if isinstance(e, Event)]

    async def main() -> tuple[list[Event], list[Event], list[bool], float]:
        async with _hub(redis_url, 0.3) as hub:
            first = await follow_one(hub)
            left = time.monotonic()
            following = [hub.following]  # it lingers after the last follower left
            async with asyncio.timeout(30):  # then it is shut
                while hub.following:
                    await asyncio.sleep(0.01)
            lingered_s = time.monotonic() - left
            following.append(hub.following)
            second = await follow_one(hub)  # and opened again for the next follower
            return first, second, following, lingered_s

    first, second, following, lingered_s = asyncio.run(main())
    assert following == [True, False]
    assert lingered_s >= 0.25, lingered_s  # about its linger (0.3 s), not at once
    for events in (first, second):
        assert [e.type for e in events] == ["status", "progress", "status"]
        assert [e.data.get("status") for e in events] == ["running", None, "succeeded"]
        # Followers get each event as in the job's stream (no job fields).
        streamed = store.events(events[0].job_id)
        assert events == streamed


def test_after_a_lost_connection_every_subscriber_is_told_to_resync(
    redis_url: str, store: JobStore
) -> None:
    async def main() -> tuple[Notice, Notice, list[Notice]]:
        async with _hub(redis_url, 5.0) as hub:
            job = _put(store)
            async with hub.subscribe(job.id) as queue, hub.subscribe_ends(job.id) as end:
                killed = 0
                for conn in store.r.client_list(_type="pubsub"):
                    if conn["name"] == HUB_NAME:
                        killed += store.r.client_kill_filter(_id=conn["id"])
                assert killed == 2  # the ends and the events connections
                lost, lost_end = await queue.get(), await end.get()
                await asyncio.to_thread(_run_to_end, store, job)  # heard again afterwards
                return lost, lost_end, await _until(end, _succeeded)

    lost, lost_end, ends = asyncio.run(main())
    assert lost == lost_end == RESYNC
    assert [e["data"] for e in ends] == [{"status": "succeeded"}]


def test_a_malformed_notice_is_skipped_and_the_hub_listens_on(
    redis_url: str, store: JobStore
) -> None:
    async def main() -> list[Notice]:
        async with _hub(redis_url, 5.0) as hub:
            job = _put(store)
            async with hub.subscribe_ends(job.id) as end:
                store.r.publish(keys.ENDS_CHANNEL, f'{{"job_id":"{job.id}","type":')
                await asyncio.to_thread(_run_to_end, store, job)
                return await _until(end, _succeeded)

    [end] = asyncio.run(main())
    assert end["data"] == {"status": "succeeded"}


def test_notices_are_read_as_json_whatever_their_spacing_or_key_order(
    redis_url: str, store: JobStore
) -> None:
    """A notice is parsed, not scanned: `"job_id": "…"` with a space, or after `data`,
    still reaches the job's subscribers; notices of other jobs do not."""

    async def main() -> list[Notice]:
        async with _hub(redis_url, 5.0) as hub:
            job = _put(store)
            async with hub.subscribe_ends(job.id) as end:
                other = {"id": "1-0", "job_id": "job_other", "type": "status", "ts": 1.0}
                store.r.publish(keys.ENDS_CHANNEL, json.dumps(other | {"data": {}}))
                ours = {"type": "status", "data": {"status": "succeeded"}, "job_id": job.id}
                store.r.publish(keys.ENDS_CHANNEL, json.dumps({**ours, "id": "2-0", "ts": 2.0}))
                return await _until(end, _succeeded)

    [end] = asyncio.run(main())
    assert end["id"] == "2-0" and end["job_id"].startswith("job_hub")


def test_event_lines_reach_their_jobs_followers_past_a_bad_line_and_json_notices_too(
    redis_url: str, store: JobStore
) -> None:
    """One message holds a line per event (`jobstore.notices`); a line that cannot be read
    is skipped, not the message; a JSON notice (a worker of an earlier mmq, during an
    upgrade) still reaches the job's followers."""

    async def main() -> list[Event | Notice]:
        async with _hub(redis_url, 5.0) as hub:
            job = _put(store)
            async with hub.subscribe(job.id) as queue:
                lines = [
                    f'1-1 {job.id} partial 1.5 18 {{"index":0,"text":"a b\\n"}}',
                    "not a line",
                    '1-2 job_other partial 1.5 0 {"index":0,"text":"x"}',
                    f'1-3 {job.id} progress 1.6 0 {{"step":1}}',
                ]
                store.r.publish(keys.EVENTS_CHANNEL, "\n".join(lines))
                old = {"id": "1-4", "job_id": job.id, "type": "status", "ts": 2.0}
                store.r.publish(
                    keys.EVENTS_CHANNEL, json.dumps([old | {"data": {"status": "succeeded"}}])
                )
                return await _until(queue, _succeeded)

    got = asyncio.run(main())
    events = [e for e in got if isinstance(e, Event)]
    assert [(e.id, e.type) for e in events] == [
        ("1-1", "partial"),
        ("1-3", "progress"),
        ("1-4", "status"),
    ]
    token = events[0]
    assert token.text_literal == b'"a b\\n"' and token.data == {"index": 0, "text": "a b\n"}
    assert token.ts == 1.5 and events[1].data == {"step": 1} and events[2].ends
