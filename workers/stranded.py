"""Task messages stranded with a dead worker before it started their job.

Celery's Redis transport keeps every delivered, unacknowledged message in its `unacked`
hash until the worker acks it; a worker that dies between taking a message and starting
the job (the job is still `queued`, so no lease exists for the reaper to see) leaves the
message there until `visibility_timeout` (hours). This sweep puts such messages back in
their queue once they are older than `grace_s` and their job is not running: a live
worker starts a job within milliseconds of taking its message, and a duplicate message
is harmless (a task for a job that is not queued is dropped without running).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

from celery import Celery

from jobs.states import JobStatus
from jobs.store import JobStore

log = logging.getLogger(__name__)

BATCH = 100


def job_id_of(payload: dict[str, Any]) -> str | None:
    """The job id argument of a Celery task message (protocol 2), None if not one."""
    try:
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def restore_stranded(app: Celery, store: JobStore, grace_s: float) -> int:
    """Requeue unacked messages older than `grace_s` whose job is not running; returns
    how many were put back."""
    restored = 0
    with app.pool.acquire(block=True) as conn:
        channel = conn.default_channel
        qos = channel.qos
        client = channel.client
        ceil = time.time() - grace_s
        tags = client.zrangebyscore(qos.unacked_index_key, "-inf", ceil, start=0, num=BATCH)
        for raw_tag in tags:
            tag = raw_tag.decode() if isinstance(raw_tag, bytes) else str(raw_tag)
            raw = client.hget(qos.unacked_key, tag)
            if raw is None:
                continue
            payload = json.loads(raw)[0]
            job_id = job_id_of(payload)
            job = store.get(job_id) if job_id else None
            if job is not None and job.status is JobStatus.RUNNING:
                continue  # a live worker holds it (or the lease sweep will take it back)
            qos.restore_by_tag(tag, client)
            restored += 1
            log.warning(
                "job %s: its task message was stranded with a dead worker; requeued", job_id
            )
    return restored
