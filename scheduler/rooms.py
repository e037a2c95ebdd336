"""What a submit may push at once (`keys.room`), per pipeline and priority, for a few
steps: a submit that finds no room (or another key's job held at its priority or above)
is held for fair share, unless it is a newcomer's (its key has nothing at the workers),
which goes to the front of the queue at once (`SUBMIT`). A pipeline without live workers,
or draining for another model's turn, has no room and takes no newcomers: its jobs are
held until one comes, or until its turn."""

from __future__ import annotations

from jobs.settings import Settings
from jobstore.scheduling import INTERACTIVE, SchedulingStore
from scheduler.slots import Slots

ROOM_STEPS = 3
"""A pipeline's room is kept this many steps: past that (no scheduler runs), submits push
their messages at once."""


def write_rooms(
    store: SchedulingStore, settings: Settings, slots: dict[str, Slots], draining: set[str]
) -> None:
    ttl_ms = int(ROOM_STEPS * settings.batches.release_interval_s * 1000) + 100
    rooms = {}
    newcomers = set()
    for pipeline in settings.enabled_pipelines:
        slot = None if pipeline in draining else slots.get(pipeline)
        rooms[pipeline] = [slot.submit_room(i) if slot else 0 for i in range(len(INTERACTIVE))]
        if slot is not None:
            newcomers.add(pipeline)
    store.write_rooms(rooms, newcomers, ttl_ms)
