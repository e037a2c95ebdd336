"""The scheduler's step, and the loop `mmq scheduler` runs (see the package's docstring)."""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

from common.redis_client import FAILOVER_ERRORS
from jobs.settings import Settings
from jobstore.batch_store import BatchStore
from jobstore.scheduling import SchedulingStore
from jobstore.store import JobStore
from scheduler.batch_feed import BatchFeed, LineAnswers
from scheduler.fair_share import FairShare
from scheduler.preemption import preempt_lines
from scheduler.rooms import write_rooms
from scheduler.slots import Room, read_slots
from scheduler.turns import draining
from storage.base import Storage

log = logging.getLogger(__name__)

LIVE_BEATS = 3
"""A worker is live while its last heartbeat is at most this many heartbeats old."""


class Scheduler:
    def __init__(
        self,
        jobs: JobStore,
        settings: Settings,
        app: Celery,
        storage: Storage,
        answers: LineAnswers,
    ) -> None:
        self.jobs = jobs
        self.settings = settings
        self.store = SchedulingStore(jobs.r)
        self.batches = BatchStore(jobs.r)
        self.fair_share = FairShare(self.store, settings.quotas.max_running)
        self.feed = BatchFeed(jobs, self.batches, settings, app, storage, answers)

    def step(self) -> None:
        """One pass: the active batches' ended lines collected, held jobs released by fair
        share, batch lines stopped for waiting interactive work, the batches fed (oldest
        first), then each pipeline's room written for submits."""
        batches = self.batches.active()
        for batch in batches:
            self.feed.collect(batch)
        since = self.jobs.server_time() - LIVE_BEATS * self.settings.lease.heartbeat_s
        live = self.store.live_workers(since)
        slots = read_slots(self.store, self.settings, live)
        drained = draining(self.store, self.settings, set(live))
        # Held jobs are released even with fair share turned off since: none is stranded.
        self.fair_share.release({p: s for p, s in slots.items() if p not in drained})
        if self.settings.batches.preempt:
            preempt_lines(self.jobs, slots)
        reserve = self.settings.batches.reserve_slots
        room = Room({p: s.batch_room(reserve) for p, s in slots.items()})
        now = time.time()
        for batch in batches:
            self.feed.feed(batch, room, now)
        if self.settings.fairness.enabled:
            write_rooms(self.store, self.settings, slots, drained)

    def run_forever(self, stop: threading.Event) -> None:
        interval_s = self.settings.batches.release_interval_s
        log.info("scheduler: a step every %ss", interval_s)
        while not stop.wait(interval_s):
            try:
                self.step()
            except FAILOVER_ERRORS as exc:  # Redis down or failing over: no traceback
                log.warning("scheduler: %s: %s", type(exc).__name__, exc)
            except (redis.RedisError, OSError, ValueError):
                log.exception("scheduler: a step failed")
