"""The reaper: gives the jobs of dead workers to live ones.

A running job whose lease expired (its worker died or hung) goes back to `queued` and is
enqueued again, within about `lease.ttl_s + lease.reaper_interval_s`. Past
`lease.max_attempts` runs it ends `failed` with the reason instead of looping.
It forgets the liveness entries of workers silent for `DEAD_WORKER_BEATS` heartbeats
(a killed worker never says goodbye), and puts back the task messages that a worker took
and died with before starting their job (`workers/stranded.py`). Several reapers may run
at once: each change is a guarded atomic transition.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

from jobs import keys
from jobs.broker import enqueue
from jobs.codec import dumps
from jobs.models import EventType
from jobs.settings import Settings
from jobs.states import JobStatus
from jobs.store import JobStore, transition
from workers.stranded import restore_stranded

log = logging.getLogger(__name__)

RUNNING = frozenset({JobStatus.RUNNING})
DEAD_WORKER_BEATS = 60


class Reaper:
    def __init__(self, store: JobStore, settings: Settings, app: Celery) -> None:
        self.store = store
        self.settings = settings
        self.app = app

    def sweep(self) -> int:
        """Requeue or fail every running job whose lease has expired; returns how many."""
        handled = 0
        for job_id in self.store.expired_running(time.time()):
            job = self.store.get(job_id)
            if job is None or job.status is not JobStatus.RUNNING:
                self.store.r.zrem(keys.RUNNING, job_id)
                continue
            if job.attempts >= self.settings.lease.max_attempts:
                error = {
                    "type": "worker_lost",
                    "message": f"the worker running this job was lost {job.attempts} times "
                    f"(max_attempts={self.settings.lease.max_attempts})",
                }
                change = transition(
                    job,
                    JobStatus.FAILED,
                    sources=RUNNING,
                    lease_mode="absent",
                    fields={"error": dumps(error), "finished_at": repr(time.time())},
                    event_data={"error": error},
                    pre_event=(EventType.ERROR, error),
                )
            else:
                change = transition(
                    job,
                    JobStatus.QUEUED,
                    sources=RUNNING,
                    lease_mode="absent",
                    fields={
                        "queued_at": repr(time.time()),
                        "started_at": "",
                        "first_output_at": "",
                    },
                    event_data={"reason": "worker_lost", "attempts": job.attempts},
                )
            result = self.store.apply(change)
            if not result.ok:
                continue
            handled += 1
            if change.target is JobStatus.QUEUED:
                log.warning("job %s: worker lost, queued again (attempt %d)", job_id, job.attempts)
                enqueue(self.app, job)
            else:
                log.error("job %s: failed after %d lost workers", job_id, job.attempts)
        return handled

    def forget_dead_workers(self) -> int:
        """Drop the liveness entries of long-silent workers; returns how many."""
        silent_since = time.time() - DEAD_WORKER_BEATS * self.settings.lease.heartbeat_s
        return int(self.store.r.zremrangebyscore(keys.WORKERS, "-inf", silent_since))

    def run_forever(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.lease.reaper_interval_s):
            try:
                self.sweep()
                restore_stranded(self.app, self.store, grace_s=self.settings.lease.ttl_s)
                self.forget_dead_workers()
            except (redis.RedisError, OSError):
                log.exception("reaper sweep failed")
