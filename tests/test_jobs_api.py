"""The job routes against a real deployment: uvicorn, Redis, Celery worker processes.
Auth, owners, headers and validation are tested in process (test_api_inprocess.py,
test_bad_input.py)."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from harness.api_client import Api, new_owner
from jobs import keys
from tuning.deployment import Deployment, wait_until


@pytest.fixture
def rclient(deployment: Deployment) -> redis.Redis:
    """The shared deployment's own Redis (conftest's `deployment`), not the session's."""
    return redis.Redis.from_url(deployment.redis_url, decode_responses=True)


def test_submit_then_poll_until_succeeded(api: Api) -> None:
    created = api.submit("echo", text="hello")
    assert created["status"] == "queued"
    assert created["urls"]["self"].endswith(f"/v1/jobs/{created['id']}")
    job = api.wait(created["id"])
    assert job["status"] == "succeeded"
    assert job["output"]["text"] == "hello"
    assert job["attempts"] == 1
    timings = job["timings"]
    assert timings["total_ms"] >= timings["run_ms"] >= 0
    assert timings["queue_wait_ms"] >= 0 and timings["time_to_first_output_ms"] > 0


def test_prefer_wait_answers_200_when_done_and_202_after_timeout(api: Api) -> None:
    r = api.http.post(
        "/v1/jobs",
        json={"kind": "echo", "input": {"text": "w"}},
        headers={"Prefer": "wait=10"},
    )
    assert r.status_code == 200 and r.json()["status"] == "succeeded"
    assert r.headers["Preference-Applied"] == "wait=10"

    # A job of a minute (canceled below): a wait of 0.5 s runs out long before it ends,
    # and long before the API's cap (60 s), however busy the machine.
    slow = api.submit("sleep", steps=600, step_ms=100)
    started = time.monotonic()
    r = api.http.get(f"/v1/jobs/{slow['id']}", headers={"Prefer": "wait=0.5"})
    assert r.status_code == 202
    assert 0.4 <= time.monotonic() - started < 10
    assert r.json()["status"] in {"queued", "running"}
    api.http.post(f"/v1/jobs/{slow['id']}/cancel")


def test_list_is_owner_scoped_filtered_and_paginated(deployment: Deployment, api: Api) -> None:
    ids = [api.submit("echo", text=f"n{i}")["id"] for i in range(7)]
    for job_id in ids:
        api.wait(job_id)
    other = new_owner(deployment.redis_url, deployment.base_url, "lister-other")
    other_id = other.submit("echo", text="not yours")["id"]

    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.http.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert other_id not in seen

    succeeded = api.http.get("/v1/jobs", params={"status": "succeeded", "kind": "echo"}).json()
    assert {j["id"] for j in succeeded["data"]} == set(ids)
    assert api.http.get("/v1/jobs", params={"kind": "sleep"}).json()["data"] == []


def test_cancel_queued_job_never_runs(
    deployment: Deployment, api: Api, rclient: redis.Redis
) -> None:
    (worker,) = [p for p in deployment.procs if p.name.startswith("worker-sleep")]
    blocker = api.submit("sleep", steps=600, step_ms=50)  # 30 s, canceled below
    queued = api.submit("sleep", steps=1, step_ms=1)
    r = api.http.post(f"/v1/jobs/{queued['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "canceled"
    api.http.post(f"/v1/jobs/{blocker['id']}/cancel")
    assert api.wait(blocker["id"])["status"] == "canceled"
    if rclient.hget(keys.job(queued["id"]), "held") == "1":
        # Held by fair share (no free slot): the scheduler drops it, never pushed.
        wait_until(lambda: rclient.hget(keys.HELD, "sleep|normal") in (None, "0"), worker)
    else:
        # The worker took the canceled job's message and dropped it without running it.
        wait_until(lambda: f"job {queued['id']}: dropped:canceled" in worker.log(), worker)
    job = api.get(queued["id"])
    assert job["status"] == "canceled" and job["attempts"] == 0 and job["started_at"] is None
    again = api.http.post(f"/v1/jobs/{queued['id']}/cancel")
    assert again.status_code == 409


def _progress(r: redis.Redis, job_id: str, after: str = "-") -> list[str]:
    """Ids of the job's progress events after stream id `after`."""
    return [i for i, e in r.xrange(keys.job_events(job_id), after) if e["type"] == "progress"]


def test_cancel_running_job_stops_at_next_step(api: Api, rclient: redis.Redis) -> None:
    # Steps of 300 ms: the cancel notice has a step or more to reach the worker.
    job = api.submit("sleep", steps=100, step_ms=300)
    wait_until(lambda: len(_progress(rclient, job["id"])) >= 2, timeout_s=20)
    assert api.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    (last_id, _) = rclient.xrevrange(keys.job_events(job["id"]), count=1)[0]
    ended = api.wait(job["id"])
    assert ended["status"] == "canceled"
    # Once the cancel was asked, at most the step then under way (and one more while
    # the notice travels) reports progress: steps, not the clock, tell it stopped.
    assert len(_progress(rclient, job["id"], f"({last_id}")) <= 2
    assert len(_progress(rclient, job["id"])) < 100


def test_idempotency_key_returns_same_job_and_refuses_other_body(api: Api) -> None:
    body = {"kind": "echo", "input": {"text": "once"}}
    headers = {"Idempotency-Key": "abc-123"}
    first = api.http.post("/v1/jobs", json=body, headers=headers)
    second = api.http.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 202
    assert second.status_code in {200, 202}
    assert first.json()["id"] == second.json()["id"]
    changed = api.http.post(
        "/v1/jobs", json={"kind": "echo", "input": {"text": "twice"}}, headers=headers
    )
    assert changed.status_code == 422
    assert changed.json()["error"]["param"] == "Idempotency-Key"
    listed = api.http.get("/v1/jobs").json()["data"]
    assert [j["id"] for j in listed] == [first.json()["id"]]


def test_failing_pipeline_fails_the_batch_and_the_worker_lives_on(api: Api) -> None:
    bad = api.submit("echo", text="x", fail=True, group="failing")
    failed = api.wait(bad["id"])
    assert failed["status"] == "failed"
    assert failed["error"]["type"] == "pipeline_error"
    assert "boom" in failed["error"]["message"]
    assert failed["attempts"] == 1
    rejected = api.wait(api.submit("echo", text="y", reject=True, group="rej")["id"])
    assert rejected["status"] == "failed"
    assert rejected["error"] == {
        "type": "invalid_input",
        "message": "text: rejected by the pipeline",
        "field": "text",
    }
    assert api.wait(api.submit("echo", text="after")["id"])["status"] == "succeeded"


def test_high_priority_job_starts_before_a_backlog(api: Api) -> None:
    # The blocker holds the worker (for up to a minute) until every job is queued behind
    # it, however long the submits take; its cancel lets the queue go.
    blocker = api.submit("sleep", steps=1000, step_ms=60)
    backlog = [api.submit("sleep", priority="normal", steps=1, step_ms=20) for _ in range(4)]
    low = api.submit("sleep", priority="low", steps=1, step_ms=20)
    urgent = api.submit("sleep", priority="high", steps=1, step_ms=20)
    assert api.http.post(f"/v1/jobs/{blocker['id']}/cancel").status_code == 200
    jobs = {j["id"]: api.wait(j["id"]) for j in [blocker, *backlog, low, urgent]}
    started = {job_id: job["started_at"] for job_id, job in jobs.items()}
    names = {blocker["id"]: "blocker", low["id"]: "low", urgent["id"]: "urgent"}
    names |= {j["id"]: f"normal{i}" for i, j in enumerate(backlog)}
    order = [names[j] for j in sorted(started, key=lambda j: started[j])]
    # The first normal job may already be the worker's next (prefetched) when it comes.
    assert all(started[urgent["id"]] < started[j["id"]] for j in backlog[1:]), order
    assert all(started[low["id"]] > started[j["id"]] for j in backlog)


def test_readyz_names_kinds_without_worker(deployment: Deployment) -> None:
    r = httpx.get(f"{deployment.base_url}/readyz")
    assert r.status_code == 200, r.text
    assert set(r.json()["kinds"]) == {"echo", "sleep"}
    assert httpx.get(f"{deployment.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{deployment.base_url}/docs").status_code == 200
    schema = httpx.get(f"{deployment.base_url}/openapi.json").json()
    assert "/v1/jobs" in schema["paths"]
