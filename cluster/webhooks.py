"""Webhook delivery: a Celery task on its own queue, never in a model worker's path.

Each attempt is recorded on the job (`GET /v1/jobs/{id}/deliveries`). 5xx, 408, 429 and
network errors or timeouts are retried with exponential backoff and jitter (a
Retry-After header is honoured up to the cap), up to `webhooks.max_attempts`; other
answers end the delivery. A job's deliveries go in its events' order: one waits until
the deliveries of the job's earlier events have ended (`jobstore.webhook_turns`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import NotRequired, TypedDict

import httpx
import redis
from celery import Celery

from broker.celery_app import (
    WEBHOOK_QUEUE,
    WEBHOOK_TASK,
    WebhookEvent,
    enqueue_webhook,
    make_celery,
)
from common import redis_client
from jobs.errors import InputError
from jobs.settings import Settings
from jobstore.deliveries import DeliveryLog
from jobstore.job_lookup import JobLookup
from jobstore.webhook_turns import WebhookTurns
from security.netguard import AddressRefused, GuardedTransport, NetPolicy, check_url
from security.signing import sign
from telemetry import tracing

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429})
TURN_WAIT_S = 0.1
"""How long a delivery whose turn has not come waits before it looks again."""


class DeliveryRecord(TypedDict):
    """One attempt at a delivery, as `GET /v1/jobs/{id}/deliveries` lists it."""

    webhook_id: str
    """`job_id.event_id`: the `webhook-id` header, the same on every attempt."""
    event_id: str
    event_type: str
    url: str
    attempt: int
    ts: float
    status_code: int | None
    """The receiver's answer; None where none came (refused, timeout, network)."""
    error: str | None
    ok: bool
    final: NotRequired[bool]
    """Set where the URL itself was refused: never retried."""
    duration_ms: NotRequired[float]
    retry: NotRequired[bool]
    next_attempt_in_s: NotRequired[float]
    """Where it is retried: after how long."""


class Deliverer:
    def __init__(self, settings: Settings, client: redis.Redis, app: Celery) -> None:
        if not settings.webhooks.secret:
            raise ValueError("webhooks.secret is not set (MMQ_WEBHOOKS__SECRET=whsec_...)")
        self.settings = settings
        self.secret = settings.webhooks.secret
        self.deliveries = DeliveryLog(client)
        self.jobs = JobLookup(client)
        self.turns = WebhookTurns(client)
        self.app = app
        self.policy = NetPolicy.from_settings(settings.net)
        # The guard checks the address again at connect time (DNS rebinding).
        self.http = httpx.Client(
            transport=GuardedTransport(self.policy),
            timeout=settings.webhooks.timeout_s,
            follow_redirects=False,
        )

    def deliver(self, job_id: str, url: str, event: WebhookEvent, attempt: int) -> str:
        """One attempt; traced (`mmq.webhook`, a child of the job's admission) where
        tracing is on."""
        parent = self.jobs.traceparent_of(job_id) if tracing.enabled() else ""
        if not parent:
            return self._deliver(job_id, url, event, attempt)
        attributes: tracing.Attributes = {
            "mmq.job_id": job_id, "mmq.attempt": attempt, "mmq.event_type": event["type"],
            "url.full": url,
        }  # fmt: skip
        with tracing.span("mmq.webhook", parent, attributes) as made:
            outcome = self._deliver(job_id, url, event, attempt)
            if made is not None:
                made.set_attribute("mmq.outcome", outcome)
            if outcome != "delivered":
                tracing.failed(made, outcome)
            return outcome

    def _deliver(self, job_id: str, url: str, event: WebhookEvent, attempt: int) -> str:
        if "job_id" in event and self._waits(job_id, event["id"], event["ts"]):
            enqueue_webhook(self.app, job_id, url, event, attempt, TURN_WAIT_S)
            return "waiting"
        body = json.dumps(event, separators=(",", ":")).encode()
        msg_id = f"{job_id}.{event['id']}"
        started = time.monotonic()
        record: DeliveryRecord = {
            "webhook_id": msg_id, "event_id": event["id"], "event_type": event["type"],
            "url": url, "attempt": attempt, "ts": time.time(), "status_code": None,
            "error": None, "ok": False,
        }  # fmt: skip
        retry_after = self._attempt(url, msg_id, body, record)
        record["duration_ms"] = round((time.monotonic() - started) * 1000, 2)
        retry = record["retry"] = self._should_retry(record) and attempt < self._max_attempts
        if retry:
            record["next_attempt_in_s"] = self._delay(attempt, retry_after)
        self.deliveries.add(job_id, record, self.settings.job_ttl_s)
        if retry:
            enqueue_webhook(self.app, job_id, url, event, attempt + 1, record["next_attempt_in_s"])
        elif "job_id" in event:
            self.turns.ended(job_id, event["id"], self.settings.job_ttl_s)
        return "delivered" if record["ok"] else "retrying" if retry else "given up"

    def _waits(self, job_id: str, event_id: str, event_ts: float) -> bool:
        """Whether this event's delivery waits for an earlier one of its job's: not past
        `webhooks.order_wait_s` from the event's time."""
        if time.time() - event_ts > self.settings.webhooks.order_wait_s:
            return False
        return self.turns.earlier_pending(job_id, event_id)

    @property
    def _max_attempts(self) -> int:
        return self.settings.webhooks.max_attempts

    def _attempt(self, url: str, msg_id: str, body: bytes, record: DeliveryRecord) -> float | None:
        timestamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "user-agent": "mmq-webhooks",
            "webhook-id": msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(self.secret, msg_id, timestamp, body),
        }
        try:
            check_url(url, "url", self.policy)
            response = self.http.post(url, content=body, headers=headers)
        except InputError as exc:
            record["error"], record["final"] = exc.reason, True
            return None
        except AddressRefused as exc:
            record["error"], record["final"] = f"refused: {exc}", True
            return None
        except httpx.TimeoutException:
            record["error"] = "timeout"
            return None
        except httpx.HTTPError as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"
            return None
        record["status_code"] = response.status_code
        record["ok"] = 200 <= response.status_code < 300
        raw = response.headers.get("retry-after", "")
        return float(raw) if raw.isdigit() else None

    @staticmethod
    def _should_retry(record: DeliveryRecord) -> bool:
        if record.get("final") or record["ok"]:
            return False
        status = record["status_code"]
        return status is None or status >= 500 or status in RETRY_STATUSES

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cap = self.settings.webhooks.backoff_max_s
        base = min(cap, self.settings.webhooks.backoff_s * 2.0 ** (attempt - 1))
        delay = base / 2 + random.uniform(0, base / 2)
        return round(min(cap, max(delay, retry_after or 0.0)), 3)


def run_webhook_worker(settings: Settings) -> None:
    """A Celery worker for the webhooks queue (threads pool, `webhooks.concurrency`)."""
    if not settings.redis_url:
        raise ValueError("redis_url is not set")
    app = make_celery(settings)
    # Retries wait as countdown (ETA) messages, which a worker must be free to reserve.
    app.conf.worker_disable_prefetch = False
    app.conf.worker_prefetch_multiplier = 4
    client = redis_client.connect(settings.redis_url)
    tracing.setup(settings.tracing, "webhooks")
    deliverer = Deliverer(settings, client, app)

    def deliver_webhook(job_id: str, url: str, event: WebhookEvent, attempt: int) -> str:
        outcome = deliverer.deliver(job_id, url, event, attempt)
        log.info("webhook %s %s attempt %d: %s", job_id, event.get("id"), attempt, outcome)
        return outcome

    app.task(name=WEBHOOK_TASK, acks_late=True, ignore_result=True)(deliver_webhook)

    app.worker_main(
        [
            "--quiet", "worker", "--pool=threads",
            f"--concurrency={settings.webhooks.concurrency}",
            f"--queues={WEBHOOK_QUEUE}", "--hostname=webhooks@%h",
            f"--loglevel={settings.log_level}", "--without-gossip", "--without-mingle",
            "--without-heartbeat",
        ]
    )  # fmt: skip
