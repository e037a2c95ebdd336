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
) -> AsyncGenerator[Event | None, None]:
    """Every event of the job after `after`, in order, once each; None for keep-alives."""
    last = stream_id_key(after) if after else (0, 0)
    async with hub.subscribe(job_id) as notices:
        for event in await store.events(job_id, after):
            last = stream_id_key(event.id)
            yield event
            if event.ends:
                return
        while True:
            try:
                notice = await asyncio.wait_for(notices.get(), keepalive_s)
            except TimeoutError:
                yield KEEPALIVE
                continue
            if notice.get("type") == "__resync__":
                fresh = await store.events(job_id, f"{last[0]}-{last[1]}")
            else:
                fresh = [Event.model_validate(notice)]
            for event in fresh:
                if stream_id_key(event.id) <= last:
                    continue
                last = stream_id_key(event.id)
                yield event
                if event.ends:
                    return
