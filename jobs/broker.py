"""The Celery app on the Redis broker: one queue per pipeline, three priorities, acks late.

Shared by the API and the reaper (which send tasks) and the workers (which run them).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from celery import Celery

from jobs.models import Job
from jobs.queues import (
    PRIORITY_STEPS,
    PRIORITY_VALUES,
    QUEUE_SEP,
    TASK_NAME,
    TaskMessage,
    celery_list,
    celery_priority,
    queue_name,
)
from jobs.settings import Settings

REDIS_TRANSPORT = "jobs.redis_transport:Transport"
"""kombu's Redis transport, sharing one Redis client per channel (see the module)."""


def make_celery(settings: Settings) -> Celery:
    if not settings.redis_url:
        raise ValueError("redis_url is not set")
    app = Celery("mmq", broker=settings.redis_url, set_as_current=False)
    if urlsplit(settings.redis_url).scheme in ("redis", "rediss"):
        app.conf.broker_transport = REDIS_TRANSPORT
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Redis only: never reserve a message that no thread is free to run, so an idle
        # worker elsewhere can take it.
        worker_disable_prefetch=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        task_default_priority=PRIORITY_VALUES["normal"],
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.queue.visibility_timeout_s,
            "priority_steps": PRIORITY_STEPS,
            "sep": QUEUE_SEP,
            "queue_order_strategy": "priority",
        },
        task_routes={TASK_NAME: {"queue": queue_name("default")}},
    )
    return app


def enqueue(app: Celery, job: Job) -> None:
    """Send the task that runs `job` to its pipeline's queue at its priority."""
    app.send_task(
        TASK_NAME,
        args=[job.id],
        queue=queue_name(job.pipeline),
        priority=celery_priority(job.priority),
    )


ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"


_TEMPLATES: weakref.WeakKeyDictionary[Celery, tuple[dict[str, Any], dict[str, Any], list[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _task_template(app: Celery) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """Headers, properties and the body after the args of a run-job task, built once per
    app by Celery (protocol 2); only the task id and the job id differ between tasks."""
    template = _TEMPLATES.get(app)
    if template is None:
        task = app.amqp.as_task_v2("", TASK_NAME, args=[""], origin=ORIGIN, ignore_result=None)
        template = _TEMPLATES[app] = (task.headers, task.properties, list(task.body[1:]))
    return template


def task_message(app: Celery, job: Job) -> TaskMessage:
    """The message `enqueue` would send for `job`, built without I/O, for the API to push
    in the same script that stores the job (one round trip; the job and its message
    exist together or not at all). Celery builds the task (protocol 2) once per app; the
    envelope is the one kombu's Redis transport writes in `Channel.basic_publish` (body
    base64, a delivery tag, the anonymous exchange routed by queue name). A test holds it
    equal to kombu's own."""
    headers, properties, rest = _task_template(app)
    queue = queue_name(job.pipeline)
    priority = celery_priority(job.priority)
    task_id = str(uuid.uuid4())
    args = [job.id]
    body = json.dumps([args, *rest]).encode()
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {**headers, "id": task_id, "root_id": task_id, "argsrepr": repr(args)},
        "properties": {
            **properties,
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return TaskMessage(celery_list(queue, priority), json.dumps(envelope))


WEBHOOK_TASK = "mmq.deliver_webhook"
WEBHOOK_QUEUE = "mmq.webhooks"


def enqueue_webhook(
    app: Celery, job_id: str, url: str, event: dict[str, object], attempt: int = 1,
    countdown_s: float | None = None,
) -> None:  # fmt: skip
    """Send one webhook delivery (of one event) to the webhooks queue."""
    app.send_task(
        WEBHOOK_TASK,
        args=[job_id, url, event, attempt],
        queue=WEBHOOK_QUEUE,
        countdown=countdown_s,
    )


def webhook_sender(app: Celery) -> Callable[[str, str, dict[str, Any]], None]:
    """An event listener for the stores: enqueue a delivery of each event a webhook wants."""

    def send(job_id: str, url: str, event: dict[str, Any]) -> None:
        enqueue_webhook(app, job_id, url, event)

    return send
