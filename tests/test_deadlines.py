"""Deadlines against real processes: a job still queued at its deadline ends `expired` and
never runs (the reaper's sweep ends it, or the worker that takes it refuses it), which
frees its place under the 429 bound; a running job that asked for it is canceled at its
deadline; a pipeline's `max_queue_s` is the default; bad deadlines are 422."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis

from api.openai.common import failure_response
from harness.api_client import Api, new_owner
from jobs import keys
from mmq.client import Client
from tuning.deployment import Deployment, Proc, flush, serving, wait_until

LEASE = {"ttl_s": 2, "heartbeat_s": 0.3, "reaper_interval_s": 0.2}
LIMITED = """
[pipelines.sleep_limited]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
max_queue_s = 0.5
"""
"""A pipeline of the sleep kind whose jobs wait at most 0.5 s; no worker serves it."""


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """API and one sleep worker (one job at a time); the reaper is started by the tests
    that want it."""
    flush(redis_url)
    overrides = {f"MMQ_LEASE__{k.upper()}": str(v) for k, v in LEASE.items()}
    deployment = Deployment(redis_url, tmp_path_factory.mktemp("deadlines"), overrides)
    with deployment.config_path.open("a") as config:
        config.write(LIMITED)
    with serving(deployment):
        deployment.start(["sleep"], reaper=False)
        yield deployment


@pytest.fixture
def owner(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"deadline{time.monotonic_ns()}")


@pytest.fixture
def reaper(dep: Deployment) -> Iterator[Proc]:
    proc = dep.start_reaper()
    # Sweeping before the test's clock starts: a reaper still importing on a busy machine
    # would miss a deadline the test measures against a job of a few seconds.
    wait_until(lambda: "reaper sweeping every" in proc.log(), proc, timeout_s=60)
    try:
        yield proc
    finally:
        proc.stop()
        dep.procs.remove(proc)


def _submit(owner: Api, inp: dict[str, Any], **extra: Any) -> dict[str, Any]:
    r = owner.http.post("/v1/jobs", json={"kind": "sleep", "input": inp, **extra})
    assert r.status_code == 202, r.text
    return dict(r.json())


def _busy(owner: Api, seconds: float) -> dict[str, Any]:
    """A job that keeps the one sleep worker busy for about `seconds`, once running."""
    job = _submit(owner, {"steps": int(seconds * 10), "step_ms": 100})
    wait_until(lambda: owner.get(job["id"])["status"] == "running", timeout_s=10)
    return job


def _status_events(client: Client, job_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in client.events(job_id) if e["type"] == "status"]


def test_the_worker_refuses_a_job_whose_deadline_passed_in_the_queue(
    dep: Deployment, owner: Api
) -> None:
    """No reaper runs: the worker that takes the job's message finds its deadline past
    and ends it `expired` without running it."""
    busy = _busy(owner, 1.5)
    late = _submit(owner, {"steps": 1, "step_ms": 0}, max_queue_s=0.3)
    assert late["deadline"] is not None
    assert owner.wait(busy["id"])["status"] == "succeeded"
    ended = owner.wait(late["id"], timeout_s=10)
    assert ended["status"] == "expired"
    assert ended["started_at"] is None and ended["attempts"] == 0 and ended["output"] is None
    client = Client(dep.base_url, owner.key)
    assert _status_events(client, late["id"]) == [
        {"status": "queued"},
        {"status": "expired", "reason": "deadline"},
    ]


def test_the_reaper_expires_a_queued_job_at_its_deadline_and_frees_its_place(
    dep: Deployment, owner: Api, reaper: Proc, rclient: redis.Redis
) -> None:
    busy = _busy(owner, 3)
    late = _submit(owner, {"steps": 1, "step_ms": 0}, max_queue_s=0.5)
    assert rclient.sismember(keys.queued("sleep"), late["id"])
    client = Client(dep.base_url, owner.key)
    statuses = _status_events(client, late["id"])  # follows live until the end
    assert statuses[-1] == {"status": "expired", "reason": "deadline"}
    # the end came at the deadline, while the worker was still busy, not once it was free
    assert owner.get(busy["id"])["status"] == "running"
    assert not rclient.sismember(keys.queued("sleep"), late["id"])  # admission freed
    assert rclient.zscore(keys.DEADLINES, late["id"]) is None
    assert owner.wait(busy["id"])["status"] == "succeeded"
    time.sleep(0.5)  # the worker has taken the expired job's message by now, and dropped it
    again = owner.get(late["id"])
    assert again["status"] == "expired" and again["started_at"] is None
    assert again["timings"]["run_ms"] is None


def test_a_running_job_is_canceled_at_its_deadline_only_when_asked(
    dep: Deployment, owner: Api, reaper: Proc
) -> None:
    asked = _submit(owner, {"steps": 60, "step_ms": 100}, max_queue_s=1.0, cancel_at_deadline=True)
    wait_until(lambda: owner.get(asked["id"])["status"] == "running", timeout_s=10)
    ended = owner.wait(asked["id"], timeout_s=10)
    assert ended["status"] == "canceled"
    client = Client(dep.base_url, owner.key)
    steps = [e for e in client.events(asked["id"]) if e["type"] == "progress"]
    assert 0 < len(steps) < 60, "canceled at its deadline, before its last step"
    assert _status_events(client, asked["id"])[-1] == {"status": "canceled", "reason": "deadline"}
    not_asked = _submit(owner, {"steps": 10, "step_ms": 100}, max_queue_s=0.5)
    assert owner.wait(not_asked["id"])["status"] == "succeeded"


def test_the_pipelines_max_queue_s_is_the_default_and_the_earlier_deadline_wins(
    dep: Deployment, owner: Api, reaper: Proc
) -> None:
    before = time.time()
    default = _submit(owner, {"model": "sleep_limited", "steps": 1})
    at = datetime.fromisoformat(default["deadline"]).timestamp()
    assert before + 0.4 < at < time.time() + 0.6
    assert owner.wait(default["id"], timeout_s=10)["status"] == "expired"

    soon = datetime.now(UTC) + timedelta(seconds=0.3)
    earlier = _submit(
        owner, {"model": "sleep_limited", "steps": 1}, deadline=soon.isoformat(), max_queue_s=60
    )
    assert datetime.fromisoformat(earlier["deadline"]) == soon
    unix = time.time() + 30
    later = _submit(owner, {"model": "sleep_limited", "steps": 1}, deadline=unix)
    assert abs(datetime.fromisoformat(later["deadline"]).timestamp() - (before + 0.5)) < 5
    assert owner.wait(earlier["id"], timeout_s=10)["status"] == "expired"


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"deadline": "2020-01-01T00:00:00Z"}, "deadline", "in the past"),
        ({"deadline": "2030-01-01T00:00:00"}, "deadline", "timezone"),
        ({"deadline": "tomorrow"}, "deadline", "datetime"),
        ({"max_queue_s": 0}, "max_queue_s", "greater than 0"),
        ({"max_queue_s": 10**9}, "max_queue_s", "less than or equal"),
        ({"cancel_at_deadline": True}, "cancel_at_deadline", "needs a deadline"),
    ],
)
def test_bad_deadlines_are_422_naming_the_field(
    owner: Api, extra: dict[str, Any], field: str, reason: str
) -> None:
    r = owner.http.post("/v1/jobs", json={"kind": "sleep", "input": {"steps": 1}, **extra})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == field, error
    assert reason in error["message"], error


def test_the_openai_routes_take_x_request_timeout(dep: Deployment, owner: Api) -> None:
    r = owner.http.post(
        "/v1/chat/completions",
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Request-Timeout": "soon"},
    )
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "x-request-timeout"
    expired = failure_response("expired", None, {})
    assert expired.status_code == 408
    assert b'"expired"' in expired.body


def test_the_openai_routes_carry_x_request_timeout_as_a_deadline(kinds_dep: Deployment) -> None:
    key = new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"rt{time.monotonic_ns()}").key
    before = time.time()
    r = httpx.post(
        f"{kinds_dep.base_url}/v1/audio/speech",
        json={"model": "tts", "voice": "joe", "input": "Hi.", "response_format": "wav"},
        headers={"Authorization": f"Bearer {key}", "X-Request-Timeout": "120"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    job = Client(kinds_dep.base_url, key).get(r.headers["X-Job-Id"])
    assert job["cancel_at_deadline"] is True
    assert before + 119 < datetime.fromisoformat(job["deadline"]).timestamp() < time.time() + 121
