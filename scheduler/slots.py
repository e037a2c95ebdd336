"""A pipeline's worker slots and what holds them, as the scheduler reads them each step:
what its live workers run at once, running jobs, messages waiting in its queue per
priority, jobs held by fair share; and the room each use may still take (interactive
submits, held jobs, batch lines)."""

from __future__ import annotations

from dataclasses import dataclass, field

from jobs.settings import Settings
from jobstore.scheduling import INTERACTIVE, SchedulingStore


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
    """Interactive messages allowed to wait in the queue beyond the slots
    (`fair_share.FairShare`)."""
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


def read_slots(store: SchedulingStore, settings: Settings, live: list[str]) -> dict[str, Slots]:
    """Each pipeline with live workers (`live`, named `PIPELINE-N@HOST`): its slots and
    what holds them now."""
    workers: dict[str, list[str]] = {}
    for name in live:
        pipeline = name.split("@", 1)[0].rsplit("-", 1)[0]
        if pipeline in settings.pipelines:
            workers.setdefault(pipeline, []).append(name)
    slots: dict[str, Slots] = {}
    for pipeline, reading in store.slot_readings(workers).items():
        concurrency = settings.pipelines[pipeline].concurrency
        # What each worker runs at once (an LLM worker: its engine's max_inflight), as it
        # published it; the setting for a worker that has not said yet.
        slot = Slots(
            total=sum(concurrency if n is None else n for n in reading.worker_slots),
            ahead=len(reading.worker_slots),
            running=len(reading.running),
            queued=reading.queued[:-1],
            batch_queued=reading.queued[-1],
            held=reading.held,
        )
        for job in reading.running:
            if job.priority == "batch" and job.preempt_requested:
                slot.preempting += 1
            elif job.priority == "batch":
                slot.lines_running.append((job.started_at, job.job_id))
        slots[pipeline] = slot
    return slots
