"""Webhooks against a real HTTP receiver: signatures, retries, timeouts, refusals."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from harness.api_client import Api, new_owner
from harness.batch_files import job_line, jsonl, upload
from harness.webhook_receiver import Receiver, receiving
from jobs.errors import InputError
from security.netguard import NetPolicy, check_url
from tests.conftest import WEBHOOK_SECRET
from tuning.deployment import Deployment, flush, serving, wait_until

TIMEOUT_S = 5
"""`webhooks.timeout_s` here: long beside a job's run and a delivery on a busy machine."""


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with receiving() as rec:
        yield rec


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    overrides = {
        "MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET,
        "MMQ_WEBHOOKS__BACKOFF_S": "0.2",
        "MMQ_WEBHOOKS__TIMEOUT_S": str(TIMEOUT_S),
        "MMQ_WEBHOOKS__MAX_ATTEMPTS": "3",
        "MMQ_NET__ALLOW_PRIVATE_ADDRESSES": "true",
    }
    deployment = Deployment(redis_url, tmp_path_factory.mktemp("hooks"), env_overrides=overrides)
    with serving(deployment):
        hooks = deployment.spawn("webhooks", "webhooks")
        deployment.start(["echo"], reaper=False)
        deployment.wait_started([hooks])
        yield deployment


@pytest.fixture
def owner(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"hook{time.monotonic_ns()}")


def _submit(owner: Api, url: str, events: list[str] | None = None, **inp: Any) -> str:
    webhook: dict[str, Any] = {"url": url, **({"events": events} if events else {})}
    body = {"kind": "echo", "input": {"text": "hi", **inp}, "webhook": webhook}
    r = owner.http.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def _deliveries(owner: Api, job_id: str) -> list[dict[str, Any]]:
    return list(owner.http.get(f"/v1/jobs/{job_id}/deliveries").json()["data"])


def test_signed_delivery_retried_on_503_until_accepted(owner: Api, receiver: Receiver) -> None:
    job_id = _submit(owner, receiver.url(f"flaky-{time.monotonic_ns()}"))
    wait_until(lambda: len(_deliveries(owner, job_id)) == 3, timeout_s=20)
    records = _deliveries(owner, job_id)
    assert [r["status_code"] for r in records] == [503, 503, 200]
    assert [r["attempt"] for r in records] == [1, 2, 3]
    assert [r["retry"] for r in records] == [True, True, False]
    assert len({r["webhook_id"] for r in records}) == 1
    calls = next(v for k, v in receiver.calls.items() if k.startswith("flaky") and len(v) == 3)
    verifier = Webhook(WEBHOOK_SECRET)
    for headers, body in calls:
        payload = verifier.verify(body, headers)
        assert payload["job_id"] == job_id
        assert payload["type"] == "status" and payload["data"]["status"] == "succeeded"


def test_a_batch_end_is_delivered_once_signed(
    dep: Deployment, owner: Api, receiver: Receiver
) -> None:
    scheduler = dep.start_scheduler()  # it runs the batch and calls the webhook
    try:
        lines = [job_line(f"b{i}", "echo", text=f"b{i}") for i in range(3)]
        source = upload(owner.http, jsonl(lines))
        path = f"batch-{time.monotonic_ns()}"
        r = owner.http.post(
            "/v1/batches",
            json={
                "input_file_id": source,
                "endpoint": "/v1/jobs",
                "webhook": {"url": receiver.url(path)},
            },
        )
        assert r.status_code == 200, r.text
        wait_until(lambda: len(receiver.got(path)) == 1, timeout_s=30)
        time.sleep(0.5)
        ((headers, body),) = receiver.got(path)  # once
        payload = Webhook(WEBHOOK_SECRET).verify(body, headers)
        assert payload["type"] == "batch.completed" and payload["batch_id"] == r.json()["id"]
        assert payload["data"]["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert payload["data"]["output_file_id"].startswith("file-")
    finally:
        scheduler.stop()
        dep.procs.remove(scheduler)


def test_all_events_arrive_in_order(owner: Api, receiver: Receiver) -> None:
    name = f"all-{time.monotonic_ns()}"
    job_id = _submit(owner, receiver.url(name), events=["all"])
    owner.wait(job_id)
    # Sent by two processes (the API's queued, the worker's others) and delivered by the
    # webhook worker's threads at once, each waits for the job's earlier ones to end.
    wait_until(lambda: len(receiver.got(name)) >= 5, timeout_s=10)
    events = [json.loads(body) for _, body in receiver.got(name)]  # as they arrived
    kinds = [(e["type"], e["data"].get("status")) for e in events]
    assert kinds == [
        ("status", "queued"), ("status", "running"), ("partial", None), ("output", None),
        ("status", "succeeded"),
    ]  # fmt: skip
    ids = [tuple(map(int, e["id"].split("-"))) for e in events]
    assert ids == sorted(ids)
    assert len(_deliveries(owner, job_id)) == 5  # one attempt each: a wait is no attempt


def test_a_receiver_that_never_answers_delays_no_other_job(owner: Api, receiver: Receiver) -> None:
    """The other job's delivery is made while the hung one waits out its timeout (5 s,
    long beside a job's run and a delivery, however busy the machine); the hung one
    ends as a timeout, to be retried."""
    hung = _submit(owner, receiver.url(f"hang-{time.monotonic_ns()}"))
    owner.wait(hung)
    quick = owner.wait(_submit(owner, receiver.url(f"ok-{time.monotonic_ns()}")))
    assert quick["status"] == "succeeded"
    wait_until(lambda: len(_deliveries(owner, quick["id"])) == 1, timeout_s=30)
    wait_until(lambda: len(_deliveries(owner, hung)) >= 1, timeout_s=30)
    (delivered,), first = _deliveries(owner, quick["id"]), _deliveries(owner, hung)[0]
    assert delivered["status_code"] == 200
    assert first["error"] == "timeout" and first["retry"] is True, first
    assert first["duration_ms"] >= TIMEOUT_S * 1000 * 0.9, first
    # Made while the hung attempt was under way, not after it (as one at a time would).
    assert delivered["ts"] < first["ts"] + first["duration_ms"] / 1000, (delivered, first)


def test_a_delivery_is_given_up_after_max_attempts(owner: Api, receiver: Receiver) -> None:
    job_id = _submit(owner, receiver.url(f"down-{time.monotonic_ns()}"))
    wait_until(lambda: len(_deliveries(owner, job_id)) == 3, timeout_s=30)
    records = _deliveries(owner, job_id)
    assert [(r["attempt"], r["status_code"], r["retry"]) for r in records] == [
        (1, 503, True), (2, 503, True), (3, 503, False),
    ]  # fmt: skip


def test_other_4xx_is_not_retried(owner: Api, receiver: Receiver) -> None:
    job_id = _submit(owner, receiver.url(f"gone-{time.monotonic_ns()}"))
    wait_until(lambda: len(_deliveries(owner, job_id)) == 1, timeout_s=10)
    time.sleep(1)
    (record,) = _deliveries(owner, job_id)
    assert record["status_code"] == 410 and record["retry"] is False


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://localhost:8080/x",
        "http://10.1.2.3/x",
        "http://192.168.0.10/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0/x",
        "ftp://example.com/x",
    ],
)
def test_non_public_urls_are_refused(url: str) -> None:
    with pytest.raises(InputError) as err:
        check_url(url, "webhook.url", NetPolicy())
    assert err.value.field == "webhook.url"
