"""Fair share: each pipeline's free slots go to its held jobs, highest priority first, and
within a priority to the key whose turn it is (stride scheduling in `RELEASE_HELD`: a
release adds 1 / weight to its key's pass, so a key with one job goes before another
key's thousandth). The release a step would make first, a newcomer's job (its key has
nothing at the workers), its submit makes at once (`SUBMIT`), to the front of the queue:
it waits neither for the next step nor behind the messages queued ahead of the slots."""

from __future__ import annotations

from jobstore.scheduling import INTERACTIVE, SchedulingStore
from scheduler.slots import Slots

MAX_DEPTH_ROUNDS = 64
"""Interactive messages waiting ahead of a pipeline's slots, at most, in rounds of them."""


class FairShare:
    def __init__(self, store: SchedulingStore, max_running: int) -> None:
        self.store = store
        self.max_running = max_running
        self._depth: dict[str, int] = {}
        """Per pipeline: interactive messages allowed to wait ahead."""

    def release(self, slots: dict[str, Slots]) -> None:
        """Held jobs into their queues while their pipeline has room.

        How many may wait in the queue ahead adapts to the jobs' length: it doubles when
        the queue ran dry and slots idled between two steps while jobs were held (short
        jobs: the workers would wait for the next step), and halves back toward half a
        round of the slots when at least half of it, and that floor, was still waiting a
        step later (long jobs: a key whose turn comes waits behind less). Half a round,
        not one: at a whole round a newcomer's p99 wait was about 2x a job
        (`bench.fairness`), and at one message per worker the slots idled between steps
        and the burst lost up to 15 % of its throughput."""
        for pipeline, slot in slots.items():
            depth = self._depth.get(pipeline, slot.total)
            floor = max(slot.ahead, slot.total // 2)
            idle = slot.running < slot.total
            if slot.held_total > 0 and slot.interactive_queued == 0 and idle:
                depth = min(MAX_DEPTH_ROUNDS * slot.total, 2 * depth)
            elif slot.interactive_queued >= max(floor, depth // 2) and depth > floor:
                depth = max(floor, depth // 2)
            self._depth[pipeline] = slot.depth = depth
            for level, priority in enumerate(INTERACTIVE):
                if slot.held[level] <= 0:
                    continue
                room = slot.interactive_room(level)
                if room <= 0:
                    break
                pushed = self.store.release_held(pipeline, priority, room, self.max_running)
                slot.queued[level] += pushed
                slot.held[level] -= pushed
