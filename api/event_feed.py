"""Follow a job's events: replay from the stream, then live notices from the hub.

Subscribes before replaying so that nothing falls between the two; notices already
replayed are skipped by id. Ends after the terminal status event. Never polls Redis:
the only reads are the replay and a re-read after the hub lost its connection. Never
sets a timer per wait either: keep-alives come from the hub's ticks, shared by every
stream (a timeout around each wait cost the API about 4 % of its CPU at 256 streams).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from api.hub import TICK, EventHub, Followed
from jobs.models import Event
from jobstore.store import AsyncJobStore

Batches = AsyncGenerator[list[Event] | None, None]
"""What `follow` yields: batches of events in order, None for a keep-alive."""

KEEPALIVE = None
"""Yielded when the job has been quiet for two of the hub's ticks (`EventHub`: one each
half `api.keepalive_s`), so a stream can send a comment at least that often."""
QUIET_TICKS = 2

StreamKey = tuple[int, int]


def stream_id_key(event_id: str) -> StreamKey:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


async def follow(
    store: AsyncJobStore,
    hub: EventHub,
    job_id: str,
    after: str | None,
    joined: Followed | None = None,
) -> Batches:
    """Every event of the job after `after`, in order, once each, in batches: the replay,
    then each time notices arrive, all those that arrived meanwhile (a stream writes a
    batch at once); None for keep-alives. Ends with the terminal status event. `joined`:
    the hub's queue of a job joined before it was stored (`JobService.submit_following`),
    which has nothing to replay; it is left at the end like one joined here."""
    last = stream_id_key(after) if after else (0, 0)
    notices = joined if joined is not None else await hub.join(job_id)
    try:
        if joined is None:
            batch, last = _after(await store.events(job_id, after), last)
            if batch:
                yield batch
                if batch[-1].ends:
                    return
        quiet = 0
        while True:
            arrived = await notices.take()  # no timeout per wait: the hub's ticks
            batch = []
            for notice in arrived:
                if isinstance(notice, Event):
                    batch.append(notice)
                elif notice is TICK:
                    quiet += 1
                else:  # RESYNC: the hub lost its connection, notices may be missing
                    batch += await store.events(job_id, f"{last[0]}-{last[1]}")
            batch, last = _after(batch, last)
            if not batch:
                if quiet >= QUIET_TICKS:
                    quiet = 0
                    yield KEEPALIVE
                continue
            quiet = 0
            yield batch
            if batch[-1].ends:
                return
    finally:
        hub.leave(job_id, notices)


def _after(events: list[Event], last: StreamKey) -> tuple[list[Event], StreamKey]:
    """The events after `last`, without duplicates, in stream order, cut after the job's
    end; and the last one's key (`last` where there is none)."""
    if len(events) == 1:  # nearly every batch of a live stream: one event of one write
        key = stream_id_key(events[0].id)
        return (events, key) if key > last else ([], last)
    keyed = [(key, e) for e in events if (key := stream_id_key(e.id)) > last]
    if len(keyed) > 1:
        keyed.sort(key=lambda pair: pair[0])
    out: list[Event] = []
    seen = last
    for key, event in keyed:
        if key == seen:
            continue
        out.append(event)
        seen = key
        if event.ends:
            break
    return out, seen
