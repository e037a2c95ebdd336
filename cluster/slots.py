"""A pipeline's worker slots and what holds them, as the release stage reads them each
step (`read_slots`): what its live workers run at once, running jobs, messages waiting in
its queue per priority, jobs held by fair share; and the room each use may still take
(interactive submits, held jobs, batch lines)."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from broker.kombu_redis import PRIORITY_VALUES, priority_list
from broker.queues import queue_name
from jobs import keys
from jobs.settings import Settings
from jobstore.codec import text_list

PRIORITIES = list(PRIORITY_VALUES)
"""In order: high, normal, low, batch."""
INTERACTIVE = PRIORITIES[:-1]


@dataclass
class Slots:
    """One pipeline's worker slots and what holds them: running jobs, messages waiting in
    its queue (interactive, and batch lines), jobs held by fair share."""

    total: int
    ahead: int
    """Messages that may wait beyond the slots (one per worker), so that a slot that
    frees between two steps is taken at once."""
    running: int
    queued: list[int]
    """Interactive messages waiting in its queue, per priority (high, normal, low)."""
    batch_queued: int
    held: list[int]
    """Jobs held by fair share, per priority (high, normal, low)."""

    depth: int = 0
    """Interactive messages allowed to wait in the queue beyond the slots (`Depth`)."""
    lines_running: list[tuple[float, str]] = field(default_factory=list)
    """(started_at, job id) of its running batch lines not yet asked to stop."""
    preempting: int = 0
    """Its running batch lines asked to stop for interactive work (`batches.preempt`)."""

    @property
    def interactive_queued(self) -> int:
        return sum(self.queued)

    @property
    def held_total(self) -> int:
        return sum(self.held)

    def interactive_room(self, level: int = len(INTERACTIVE) - 1) -> int:
        """Messages of priority `INTERACTIVE[level]` that may still be pushed: the slots,
        and `depth` waiting ahead (a slot that frees between two steps takes the next at
        once; a key whose turn comes waits behind at most that). Messages of lower
        priorities and batch lines waiting in the queue do not count: a worker takes the
        higher one first."""
        ahead = sum(self.queued[: level + 1])
        return self.total + (self.depth or self.total) - self.running - ahead

    def submit_room(self, level: int) -> int:
        """What a submit at `INTERACTIVE[level]` may push at once: none while a job is
        held at that priority or above (it goes first)."""
        if sum(self.held[: level + 1]) > 0:
            return 0
        return max(0, self.interactive_room(level))

    def to_preempt(self) -> list[str]:
        """The batch lines to stop so that interactive work waiting for a slot gets one:
        as many as wait beyond the free slots and the lines already stopping, those that
        started last first (the least work lost)."""
        waiting = self.interactive_queued + self.held_total
        wanted = waiting - max(0, self.total - self.running) - self.preempting
        newest_first = sorted(self.lines_running, reverse=True)
        return [job_id for _, job_id in newest_first[: max(0, wanted)]]

    def batch_room(self, reserve: int) -> int:
        """Batch lines that may still be released: none while interactive work waits."""
        if self.interactive_queued or self.held_total > 0:
            return 0
        ahead = 0 if reserve else self.ahead
        return self.total + ahead - reserve - self.running - self.batch_queued


@dataclass
class Room:
    """Per pipeline: slots a batch line may still take."""

    free: dict[str, int]

    def take(self, pipeline: str) -> bool:
        if self.free.get(pipeline, 0) <= 0:
            return False
        self.free[pipeline] -= 1
        return True


def read_slots(r: redis.Redis, settings: Settings, live: list[str]) -> dict[str, Slots]:
    """Each pipeline with live workers (`live`, named `PIPELINE-N@HOST`): its slots and
    what holds them now, in two round trips."""
    workers: dict[str, list[str]] = {}
    for name in live:
        pipeline = name.split("@", 1)[0].rsplit("-", 1)[0]
        if pipeline in settings.pipelines:
            workers.setdefault(pipeline, []).append(name)
    running_ids = text_list(r.zrange(keys.RUNNING, 0, -1))
    pipe = r.pipeline(transaction=False)
    for pipeline, names in workers.items():
        for name in names:
            pipe.hget(keys.worker(name), "slots")
        for priority in PRIORITIES:
            pipe.llen(priority_list(queue_name(pipeline), PRIORITY_VALUES[priority]))
        pipe.hmget(keys.HELD, [f"{pipeline}|{p}" for p in INTERACTIVE])
    for job_id in running_ids:
        pipe.hmget(keys.job(job_id), "pipeline", "priority", "started_at", "preempt_requested")
    found = iter(pipe.execute())
    slots: dict[str, Slots] = {}
    for pipeline, names in workers.items():
        concurrency = settings.pipelines[pipeline].concurrency
        # What each worker runs at once (an LLM worker: its engine's max_inflight), as it
        # published it; the setting for a worker that has not said yet.
        total = sum(int(next(found) or concurrency) for _ in names)
        lengths = [int(next(found)) for _ in PRIORITIES]
        held = [max(0, int(n or 0)) for n in next(found)]
        slots[pipeline] = Slots(
            total=total,
            ahead=len(names),
            running=0,
            queued=lengths[:-1],
            batch_queued=lengths[-1],
            held=held,
        )
    for job_id, (pipeline, priority, started_at, preempt) in zip(running_ids, found, strict=True):
        slot = slots.get(str(pipeline))
        if slot is None:
            continue
        slot.running += 1
        if priority == "batch" and preempt == "1":
            slot.preempting += 1
        elif priority == "batch":
            slot.lines_running.append((float(started_at or 0), job_id))
    return slots
