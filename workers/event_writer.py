"""The events of a worker's running jobs, written on one thread: in order per job, and in
one Redis round trip for everything that arrived meanwhile.

A pipeline hands an event over and goes on at once: a token stream never waits for Redis.
The writer takes every event handed over since its last write and writes them with one
script call (one round trip, one pub/sub notice). While a write is in flight the events
that arrive wait for the next one, and a partial event that follows a partial of the same
job is merged into it where the pipeline says how (`Pipeline.merge_partials`: LLM tokens
become one delta). Nothing is held back: an idle writer writes an event the moment it
arrives. `flush()` returns once everything handed over before it is written, so a job's
end is never recorded before its outputs. An event carries the lease of its run; the
script drops it if the job no longer has that lease (the run was abandoned: the lease ran
out while this worker was cut off, and the job went back to the queue or ended).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import redis

from jobs.models import EventType, WebhookSpec
from jobs.outputs import PartialData
from jobstore.store import JobStore, NewEvent
from pipelines.base import TakePartial

log = logging.getLogger(__name__)

Merge = Callable[[PartialData, PartialData], PartialData | None]
"""(earlier partial's data, later partial's data) -> one partial's data, or None."""

MAX_BATCH = 512
"""Events written by one script call at most."""
RETRIES_S = (0.1, 0.5, 1.0, 2.0)
"""Waits before writing a batch again after a Redis error; then it is dropped (logged)."""

Touch = Callable[[], None]
"""Says that a stream has pending output (`EventWriter.stream`)."""


@dataclass(eq=False, slots=True)
class _Stream:
    job_id: str
    take: TakePartial
    webhook: WebhookSpec | None
    lease_token: str
    queued: bool = False
    """In the writer's pending list: a `touch` has nothing to do."""

    def event(self) -> NewEvent | None:
        taken = self.take()
        if taken is None:
            return None
        data, first, text_at = taken
        return NewEvent(
            self.job_id,
            EventType.PARTIAL,
            data,
            first,
            self.webhook,
            lease_token=self.lease_token,
            text_at=text_at,
        )


class EventWriter:
    def __init__(self, store: JobStore, merge: Merge | None = None) -> None:
        self.store = store
        self.merge = merge
        self._pending: list[NewEvent | _Stream] = []
        self._handed = 0
        self._written = 0
        self._cv = threading.Condition()
        self._idle = False
        """Whether the writer waits for events (only then does `emit` wake it)."""
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="event-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write what is pending, then stop."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout_s)

    def emit(self, event: NewEvent) -> None:
        """Hand an event over; it is written in order after those handed over before."""
        with self._cv:
            self._pending.append(event)
            self._handed += 1
            if self._idle:
                self._cv.notify_all()

    def stream(
        self, job_id: str, take: TakePartial, webhook: WebhookSpec | None, lease_token: str = ""
    ) -> Touch:
        """A job's stream of partial outputs: call the returned `touch` after each piece
        its pipeline keeps for writing; the writer calls `take` when it writes next (on
        its own thread: `take` and the pipeline's keeping share a lock of their own)."""
        stream = _Stream(job_id, take, webhook, lease_token)

        def touch() -> None:
            if stream.queued:  # the writer clears it (under `_cv`) before it calls `take`
                return
            with self._cv:
                if stream.queued:
                    return
                stream.queued = True
                self._pending.append(stream)
                self._handed += 1
                if self._idle:
                    self._cv.notify_all()

        return touch

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every event handed over so far is written; False on timeout."""
        with self._cv:
            target = self._handed
            return self._cv.wait_for(lambda: self._written >= target, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                self._idle = True
                self._cv.wait_for(lambda: bool(self._pending) or self._stopping)
                self._idle = False
                if not self._pending:
                    return
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                for item in batch:
                    if isinstance(item, _Stream):
                        item.queued = False  # a piece kept from now on queues it again
            events = [e for e in map(_event_of, batch) if e is not None]
            self._write(merged(events, self.merge))
            with self._cv:
                self._written += len(batch)
                self._cv.notify_all()

    def _write(self, batch: list[NewEvent]) -> None:
        for wait_s in (*RETRIES_S, None):
            try:
                ids = self.store.append_events(batch)
                _log_fenced(batch, ids)
                return
            except redis.RedisError as exc:
                if wait_s is None:
                    jobs = sorted({e.job_id for e in batch})
                    log.error("dropped %d events of jobs %s: %s", len(batch), jobs, exc)
                    return
                log.warning(
                    "writing %d events failed (%s); again in %.1fs", len(batch), exc, wait_s
                )
                time.sleep(wait_s)
            except Exception:  # a bad event must not stop the writer of every job
                log.exception("dropped %d events that could not be written", len(batch))
                return


def merged(batch: list[NewEvent], merge: Merge | None) -> list[NewEvent]:
    """`batch` with each partial event merged into the job's previous one where both are
    partials and `merge` joins them (the order of each job's events is kept)."""
    if merge is None:
        return batch
    out: list[NewEvent] = []
    last: dict[str, int] = {}
    for event in batch:
        at = last.get(event.job_id)
        if at is not None and event.type is EventType.PARTIAL:
            before = out[at]
            same_run = before.type is EventType.PARTIAL and before.lease_token == event.lease_token
            joined = None
            if same_run and isinstance(before.data, dict) and isinstance(event.data, dict):
                joined = merge(before.data, event.data)  # bytes (a stream's) are never merged
            if joined is not None:
                # keeps its first token's time; the store takes a plain dict
                out[at] = replace(before, data=dict(joined))
                continue
        last[event.job_id] = len(out)
        out.append(event)
    return out


def _event_of(item: NewEvent | _Stream) -> NewEvent | None:
    return item.event() if isinstance(item, _Stream) else item


def _log_fenced(batch: list[NewEvent], ids: list[str]) -> None:
    """Say which jobs' events were dropped because their run no longer has the lease."""
    fenced = sorted({e.job_id for e, event_id in zip(batch, ids, strict=True) if not event_id})
    if fenced:
        log.warning("dropped events of jobs %s: their run here no longer holds the lease", fenced)
