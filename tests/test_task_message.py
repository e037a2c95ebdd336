"""The task message the API pushes in its submit script is the one kombu would send."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import redis

from jobs.broker import enqueue, make_celery, task_message
from jobs.models import Job
from jobs.settings import Priority, load_settings
from jobs.states import JobStatus


def _job(priority: Priority) -> Job:
    now = time.time()
    return Job(
        id=f"job_{priority}", kind="noop", pipeline="noop", status=JobStatus.QUEUED,
        owner="o", priority=priority, input={}, created_at=now, queued_at=now,
    )  # fmt: skip


def _shape(value: Any) -> Any:
    """Keys and value types, recursively: what must match between two messages whose
    ids and origins differ."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_envelope_and_list_equal_kombus_own(
    redis_url: str, rclient: redis.Redis, priority: Priority
) -> None:
    app = make_celery(load_settings(None, redis_url=redis_url))
    job = _job(priority)
    before = set(rclient.keys("mmq.noop*"))
    enqueue(app, job)
    (sent_list,) = set(rclient.keys("mmq.noop*")) - before
    sent = json.loads(rclient.rpop(sent_list))
    ours = task_message(app, job)
    mine = json.loads(ours.envelope)
    assert ours.list_key == sent_list
    assert _shape(mine) == _shape(sent)
    for field in ("lang", "task", "retries", "timelimit", "argsrepr", "ignore_result"):
        assert mine["headers"][field] == sent["headers"][field], field
    for field in ("delivery_mode", "delivery_info", "priority", "body_encoding"):
        assert mine["properties"][field] == sent["properties"][field], field
    assert base64.b64decode(mine["body"]) == base64.b64decode(sent["body"])
    assert mine["headers"]["id"] == mine["headers"]["root_id"] != sent["headers"]["id"]
    assert mine["properties"]["correlation_id"] == mine["headers"]["id"]
    again = json.loads(task_message(app, job).envelope)  # built from the same template
    assert again["headers"]["id"] != mine["headers"]["id"]
    assert again["properties"]["delivery_tag"] != mine["properties"]["delivery_tag"]
