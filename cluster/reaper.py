"""The reaper: gives the jobs of dead workers to live ones.

A running job whose lease expired (its worker died or hung) goes back to `queued`, with
its new task message pushed by the same script, within about `lease.ttl_s +
lease.reaper_interval_s`. Past `lease.max_attempts` runs it ends `failed` with the reason
instead of looping. It forgets the liveness entries of workers silent for
`DEAD_WORKER_BEATS` heartbeats (a killed worker never says goodbye), gives a task message
back to queued jobs that lack one (`cluster/stranded.py`), and enforces the deadlines that
have passed (`expire`). Several reapers may run at once: each change is a guarded atomic
script.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

from broker.celery_app import job_message
from cluster.stranded import resend_missing, restore_stranded
from common.redis_client import FAILOVER_ERRORS
from jobs.errors import NotDurable
from jobs.models import Job
from jobs.settings import Settings
from jobs.states import JobStatus
from jobs.wire import JobError
from jobstore import operations
from jobstore.changes import Transition
from jobstore.liveness import LivenessStore
from jobstore.store import JobStore
from telemetry import tracing

log = logging.getLogger(__name__)

RUNNING = frozenset({JobStatus.RUNNING})
DEAD_WORKER_BEATS = 60
MISSING_SWEEP_EVERY = 10
"""Sweeps between two looks for queued jobs without a message (it reads every queue)."""


class Reaper:
    def __init__(self, store: JobStore, settings: Settings, app: Celery) -> None:
        self.store = store
        self.settings = settings
        self.app = app
        self._sweeps = 0

    def sweep(self) -> int:
        """Requeue or fail every running job whose lease has expired; returns how many."""
        handled = 0
        for job_id in self.store.expired_running():
            job = self.store.get(job_id)
            if job is None or job.status is not JobStatus.RUNNING:
                self.store.forget_running(job_id)
                continue
            change = self._take_back(job)
            try:
                if not self._apply(change):
                    continue
            except redis.ResponseError:  # this job's script failed: nothing of it changed
                log.exception("job %s: could not take it back; trying again next sweep", job_id)
                continue
            handled += 1
            _trace_lost_run(job)
            if change.target is JobStatus.QUEUED:
                log.warning("job %s: worker lost, queued again (attempt %d)", job_id, job.attempts)
            else:
                log.error("job %s: failed after %d lost workers", job_id, job.attempts)
        return handled

    def _take_back(self, job: Job) -> Transition:
        """The change for a running job whose worker was lost: queued again with its
        message, or failed once it has used its attempts."""
        if job.attempts >= self.settings.lease.max_attempts:
            error: JobError = {
                "type": "worker_lost",
                "message": f"the worker running this job was lost {job.attempts} times "
                f"(max_attempts={self.settings.lease.max_attempts})",
            }
            return operations.fail_lost(job, error)
        return operations.requeue_lost(job, job_message(self.app, job))

    def expire(self) -> int:
        """Enforce the deadlines that have passed: a queued job ends `expired` (which frees
        its place under the 429 bound; its task message is dropped when a worker takes
        it), and a running one that asked for it (`cancel_at_deadline`) is asked to stop
        (its worker ends it `canceled`). Returns how many it acted on."""
        handled = 0
        for job_id in self.store.past_deadline():
            job = self.store.get(job_id)
            if job is not None and job.status is JobStatus.QUEUED:
                if self._apply(operations.expire(job)):
                    handled += 1
                    log.info("job %s: deadline passed in the queue: expired", job_id)
                continue  # refused: it started meanwhile; the next sweep sees it running
            if job is not None and job.status is JobStatus.RUNNING and job.cancel_at_deadline:
                self.store.request_cancel(job_id)
                handled += 1
                log.info("job %s: deadline passed while running: cancel requested", job_id)
            # Ended, gone, running without a cancel asked for, or asked to stop: done here.
            self.store.forget_deadline(job_id)
        return handled

    def _apply(self, change: Transition) -> bool:
        """Apply the change; whether it was made. One that ended its job but was not
        confirmed at `redis.durability` within a lease's time is logged, and counts as made
        (the store has announced it and handed it on; a failover that loses it leaves the
        job as it was, for a later sweep)."""
        try:
            return self.store.apply(change).ok
        except NotDurable as exc:
            log.error("%s", exc.message)
            return True

    def resend(self) -> int:
        """Give a task message back to queued jobs that lack one; returns how many. Looks
        for missing ones every `MISSING_SWEEP_EVERY` calls."""
        grace_s = self.settings.lease.ttl_s
        sent = restore_stranded(self.app, self.store, grace_s)
        if self._sweeps % MISSING_SWEEP_EVERY == 0:
            sent += resend_missing(self.app, self.store, grace_s)
        self._sweeps += 1
        return sent

    def forget_dead_workers(self) -> int:
        """Drop the liveness entries of long-silent workers; returns how many."""
        beats_s = DEAD_WORKER_BEATS * self.settings.lease.heartbeat_s
        silent_since = self.store.server_time() - beats_s
        return LivenessStore(self.store.r).forget_silent(silent_since)

    def run_forever(self, stop: threading.Event) -> None:
        log.info("reaper sweeping every %ss", self.settings.lease.reaper_interval_s)
        while not stop.wait(self.settings.lease.reaper_interval_s):
            try:
                self.sweep()
                self.expire()
                self.resend()
                self.forget_dead_workers()
            except FAILOVER_ERRORS as exc:  # Redis down or failing over: no traceback
                log.warning("reaper sweep failed: %s: %s", type(exc).__name__, exc)
            except (redis.RedisError, OSError):
                log.exception("reaper sweep failed")


def _trace_lost_run(job: Job) -> None:
    """The span of a run whose worker was lost (it could not end its own): from its start
    to now, failed."""
    if not (job.traceparent and tracing.enabled()):
        return
    attributes: tracing.Attributes = {
        "mmq.job_id": job.id, "mmq.pipeline": job.pipeline, "mmq.kind": job.kind,
        "mmq.attempt": job.attempts, "mmq.worker": job.worker or "", "mmq.status": "lost",
    }  # fmt: skip
    started = job.started_at or job.queued_at
    tracing.record(
        "mmq.run", started, time.time(), attributes, parent=job.traceparent, error="worker lost"
    )
