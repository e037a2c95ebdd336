"""The Celery app on the Redis broker: one queue per pipeline, three priorities, acks late.

Shared by the API and the reaper (which queue jobs) and the workers (which run them). The
broker's Redis layout is `broker/kombu_redis.py`'s alone.
"""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from broker import kombu_redis
from broker.kombu_redis import PRIORITY_VALUES, TaskMessage
from broker.queues import TASK_NAME, queue_name
from jobs.models import Job
from jobs.settings import Settings
from jobs.wire import BatchEvent, JobEvent


def make_celery(settings: Settings) -> Celery:
    if not settings.redis_url:
        raise ValueError("redis_url is not set")
    broker = kombu_redis.broker_for(settings.redis_url)
    app = Celery("mmq", broker=broker.url, set_as_current=False)
    app.conf.broker_transport = broker.transport
    if broker.failover_strategy is not None:
        app.conf.broker_failover_strategy = broker.failover_strategy
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
            **kombu_redis.transport_options(settings.queue.visibility_timeout_s),
            **broker.options,
        },
        task_routes={TASK_NAME: {"queue": queue_name("default")}},
    )
    return app


def job_message(app: Celery, job: Job) -> TaskMessage:
    """The task message that runs `job` on its pipeline's queue at its priority, for the
    script that stores (submit) or requeues (reaper) the job to push with it."""
    return kombu_redis.task_message(app, job.id, queue_name(job.pipeline), job.priority)


WEBHOOK_TASK = "mmq.deliver_webhook"
WEBHOOK_QUEUE = "mmq.webhooks"

WebhookEvent = JobEvent | BatchEvent
"""What a webhook delivery sends: a job's event, or a batch's end."""


def enqueue_webhook(
    app: Celery, job_id: str, url: str, event: WebhookEvent, attempt: int = 1,
    countdown_s: float | None = None,
) -> None:  # fmt: skip
    """Send one webhook delivery (of one event) to the webhooks queue."""
    app.send_task(
        WEBHOOK_TASK,
        args=[job_id, url, event, attempt],
        queue=WEBHOOK_QUEUE,
        countdown=countdown_s,
    )


def webhook_sender(app: Celery) -> Callable[[str, str, JobEvent], None]:
    """An event listener for the stores: enqueue a delivery of each event a webhook wants."""

    def send(job_id: str, url: str, event: JobEvent) -> None:
        enqueue_webhook(app, job_id, url, event)

    return send
