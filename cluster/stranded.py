"""Queued jobs without a runnable task message, and the sweeps that give them one.

A queued job is run by its task message. Two ways it can sit without one:

- **stranded**: a worker took the message and died before starting the job (so no lease
  exists for the lease sweep to see). kombu keeps a delivered, unacknowledged message in
  its `unacked` record until `visibility_timeout` (hours); `restore_stranded` puts back a
  run-job message older than `grace_s` whose job is not running (a live worker starts a
  job within milliseconds of taking its message).
- **missing**: no message anywhere (older data, a manual edit, a Redis that lost a write):
  `resend_missing` sends a new one for a job queued longer than `grace_s` whose message is
  neither waiting in its queue nor unacknowledged.

A duplicate message is harmless either way: a task for a job that is not queued, or
whose lease a live worker holds, is dropped without running.
"""

from __future__ import annotations

import logging
import time

from celery import Celery

from broker.celery_app import job_message
from broker.kombu_redis import Unacked, queued_job_ids
from broker.queues import queue_name
from jobs.models import Job
from jobs.states import TERMINAL, JobStatus
from jobstore.store import JobStore
from telemetry.metric_defs import MESSAGES_RESENT, Sample

log = logging.getLogger(__name__)

BATCH = 100


def restore_stranded(app: Celery, store: JobStore, grace_s: float) -> int:
    """Requeue unacked run-job messages older than `grace_s` whose job is not running;
    returns how many were put back. A message whose job has ended, or was queued again
    with a new message after this one was delivered (the lease sweep took it back from a
    lost worker), is dropped instead: putting it back would only run into a refusal. (The
    two times come from different hosts' clocks; a message dropped by mistake because of
    skew leaves its job queued without a message, which `resend_missing` sends again.)"""
    unacked = Unacked(app)
    restored = 0
    for tag, job_id, delivered_at in unacked.older_than(time.time() - grace_s, BATCH):
        if job_id is None:
            continue  # not a run-job message (webhook deliveries wait on their ETA)
        job = store.get(job_id)
        if job is not None and job.status is JobStatus.RUNNING:
            continue  # a live worker holds it (or the lease sweep will take it back)
        if job is not None and _superseded(job, delivered_at):
            unacked.discard(tag)
            log.info("job %s: dropped a stranded task message it no longer needs", job_id)
            continue
        unacked.restore(tag)
        restored += 1
        log.warning("job %s: its task message was stranded with a dead worker; requeued", job_id)
    store.tally.add(_resent("stranded", restored))
    return restored


def _superseded(job: Job, delivered_at: float) -> bool:
    """Whether a message delivered at `delivered_at` is of no use to its job any more:
    the job ended, or was queued again (with its own new message) after the delivery."""
    if job.status in TERMINAL:
        return True
    return job.status is JobStatus.QUEUED and job.queued_at > delivered_at


def resend_missing(app: Celery, store: JobStore, grace_s: float) -> int:
    """Send a new task message for each job queued longer than `grace_s` that has none;
    returns how many were sent."""
    queued = store.queued_since(time.time() - grace_s, BATCH)
    if not queued:
        return 0
    jobs = [job for job in map(store.get, queued) if job and job.status is JobStatus.QUEUED]
    # Waiting lists first, then unacked: the way a message moves when a worker takes it.
    have: set[str] = set()
    for pipeline in {job.pipeline for job in jobs}:
        have |= queued_job_ids(store.r, queue_name(pipeline))
    have |= Unacked(app).job_ids()
    sent = 0
    for job in jobs:
        if job.id not in have and store.resend(job.id, job_message(app, job)):
            sent += 1
            log.warning("job %s: queued without a task message; sent it again", job.id)
    store.tally.add(_resent("missing", sent))
    return sent


def _resent(reason: str, count: int) -> list[Sample]:
    return [(MESSAGES_RESENT, (reason,), count)] if count else []
