"""Follow a job's events: replay from the stream, then live notices from the hub.

Subscribes before replaying so that nothing falls between the two; notices already
replayed are skipped by id. Ends after the terminal status event. Never polls Redis:
the only reads are the replay and a re-read after the hub lost its connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from api.hub import EventHub
from jobs.models import Event
from jobs.store import AsyncJobStore

Batches = AsyncGenerator[list[Event] | None, None]
"""What `follow` yields: batches of events in order, None for a keep-alive."""

KEEPALIVE = None
"""Yielded after `keepalive_s` without an event, so a stream can send a comment."""


def stream_id_key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


async def follow(
    store: AsyncJobStore,
    hub: EventHub,
    job_id: str,
    after: str | None,
    keepalive_s: float,
) -> Batches:
    """Every event of the job after `after`, in order, once each, in batches: the replay,
    then each time notices arrive, all those that arrived meanwhile (a stream writes a
    batch at once); None for keep-alives. Ends with the terminal status event."""
    last = stream_id_key(after) if after else (0, 0)
    async with hub.subscribe(job_id) as notices:
        batch = _up_to_end(await store.events(job_id, after))
        if batch:
            last = stream_id_key(batch[-1].id)
            yield batch
            if batch[-1].ends:
                return
        while True:
            if notices.empty():
                try:
                    async with asyncio.timeout(keepalive_s):
                        arrived = [await notices.get()]  # on a timeout it stays queued
                except TimeoutError:
                    yield KEEPALIVE
                    continue
            else:
                arrived = [notices.get_nowait()]
            while not notices.empty():
                arrived.append(notices.get_nowait())
            batch = []
            for notice in arrived:
                if isinstance(notice, Event):
                    batch.append(notice)
                else:  # RESYNC: the hub lost its connection, notices may be missing
                    batch += await store.events(job_id, f"{last[0]}-{last[1]}")
            batch = _up_to_end([e for e in batch if stream_id_key(e.id) > last])
            if not batch:
                continue
            last = stream_id_key(batch[-1].id)
            yield batch
            if batch[-1].ends:
                return


def _up_to_end(events: list[Event]) -> list[Event]:
    """`events` without duplicates, in stream order, cut after the job's end."""
    seen: dict[str, Event] = {}
    for event in sorted(events, key=lambda e: stream_id_key(e.id)):
        seen.setdefault(event.id, event)
        if event.ends:
            break
    return list(seen.values())
