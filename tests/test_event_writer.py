"""A worker's event writer against real Redis: events are written in order per job, an
idle writer writes at once, several events travel in one notice that the API's hub
splits, `flush` waits for what was handed over, and tokens that waited are merged."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from api.hub import EventHub
from jobs import keys
from jobs.models import Event, EventType, WebhookSpec
from jobs.settings import Settings
from jobstore.store import JobStore, NewEvent
from workers.event_writer import EventWriter, merged


def _tokens(first: dict[str, Any], then: dict[str, Any]) -> dict[str, Any]:
    return {"index": first["index"], "text": first["text"] + then["text"]}


def _partial(job_id: str, i: int, text: str) -> NewEvent:
    return NewEvent(job_id, EventType.PARTIAL, {"index": i, "text": text}, True)


@pytest.fixture
def store(redis_url: str) -> JobStore:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return JobStore(client, Settings(redis_url=redis_url))


def _stream(store: JobStore, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    entries = store.r.xrange(keys.job_events(job_id))
    return [(e["type"], json.loads(e["data"])) for _, e in entries]


def test_merge_joins_a_jobs_consecutive_partials_and_keeps_every_order() -> None:
    progress = NewEvent("b", EventType.PROGRESS, {"step": 1})
    batch = [
        _partial("a", 0, "Hel"), _partial("b", 0, "x"), _partial("a", 1, "lo"), progress,
        _partial("b", 1, "y"), _partial("a", 2, "!"),
    ]  # fmt: skip
    out = merged(batch, _tokens)
    assert [(e.job_id, e.type, e.data) for e in out] == [
        ("a", EventType.PARTIAL, {"index": 0, "text": "Hello!"}),
        ("b", EventType.PARTIAL, {"index": 0, "text": "x"}),
        ("b", EventType.PROGRESS, {"step": 1}),
        ("b", EventType.PARTIAL, {"index": 1, "text": "y"}),  # not across the progress
    ]
    assert out[0].ts == batch[0].ts  # the merged delta keeps its first token's time
    assert merged(batch, None) == batch
    assert merged(batch, lambda first, then: None) == batch


def test_an_idle_writer_writes_at_once_and_flush_waits_for_everything(store: JobStore) -> None:
    writer = EventWriter(store, merge=_tokens)
    writer.start()
    try:
        job_id = f"job_w{time.monotonic_ns()}"
        writer.emit(_partial(job_id, 0, "first"))
        deadline = time.monotonic() + 5
        while not _stream(store, job_id) and time.monotonic() < deadline:
            time.sleep(0.005)  # no flush: an idle writer holds nothing back
        assert _stream(store, job_id) == [("partial", {"index": 0, "text": "first"})]
        tokens = [f"t{i} " for i in range(300)]
        for i, token in enumerate(tokens):
            writer.emit(_partial(job_id, i + 1, token))
        writer.emit(NewEvent(job_id, EventType.PROGRESS, {"step": 1}))
        assert writer.flush(timeout_s=10)
        events = _stream(store, job_id)
        texts = [data["text"] for etype, data in events[1:-1]]
        assert "".join(texts) == "".join(tokens)  # in order, none lost, none twice
        assert events[-1] == ("progress", {"step": 1})
        assert [data["index"] for _, data in events[1:-1]] == sorted(
            data["index"] for _, data in events[1:-1]
        )
    finally:
        writer.stop()


@pytest.mark.anyio
async def test_one_notice_of_several_jobs_reaches_each_jobs_followers(
    redis_url: str, store: JobStore
) -> None:
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    hub = EventHub(client)
    await hub.start()
    first, second = f"job_n{time.monotonic_ns()}", f"job_m{time.monotonic_ns()}"
    try:
        async with hub.subscribe(first) as one, hub.subscribe(second) as two:
            batch = [_partial(first, 0, "a"), _partial(second, 0, "b"), _partial(first, 1, "c")]
            ids = await asyncio.to_thread(store.append_events, batch)
            async with asyncio.timeout(5):
                got_one = [await one.get(), await one.get()]
                got_two = [await two.get()]
        assert all(isinstance(e, Event) for e in [*got_one, *got_two])
        assert [e.id for e in got_one] == [ids[0], ids[2]]
        assert [e.data["text"] for e in got_one] == ["a", "c"]
        assert (got_two[0].id, got_two[0].job_id) == (ids[1], second)
    finally:
        await hub.stop()
        await client.aclose()


def test_an_event_made_under_a_lease_its_job_no_longer_has_is_dropped(store: JobStore) -> None:
    """The fence of an abandoned run: its job's lease ran out (or passed to another run),
    so what it still sends never reaches the stream, the notice or a webhook."""
    job_id = f"job_f{time.monotonic_ns()}"
    handed: list[dict[str, Any]] = []
    fenced = JobStore(store.r, store.settings, on_event=lambda _j, _u, e: handed.append(e))
    webhook = WebhookSpec(url="https://example.com/hook", events=["progress"])
    store.r.set(keys.lease(job_id), "second-run", px=5000)

    def event(step: int, token: str) -> NewEvent:
        data = {"step": step}
        return NewEvent(job_id, EventType.PROGRESS, data, webhook=webhook, lease_token=token)

    ids = fenced.append_events([event(1, "first-run"), event(2, "second-run"), event(3, "")])
    assert ids[0] == "" and ids[1] and ids[2]
    assert _stream(store, job_id) == [("progress", {"step": 2}), ("progress", {"step": 3})]
    assert [e["data"] for e in handed] == [{"step": 2}, {"step": 3}]
    store.r.delete(keys.lease(job_id))  # ran out: nothing made under a lease is written
    assert fenced.append_events([event(4, "second-run")]) == [""]
    assert len(_stream(store, job_id)) == 2


def test_partials_of_two_runs_of_a_job_are_never_merged() -> None:
    first = NewEvent("a", EventType.PARTIAL, {"index": 0, "text": "old"}, lease_token="one")
    then = NewEvent("a", EventType.PARTIAL, {"index": 0, "text": "new"}, lease_token="two")
    assert merged([first, then], _tokens) == [first, then]
