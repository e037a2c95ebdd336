"""The admin routes of the web console against a real deployment (uvicorn, Redis, Celery
workers): the overview (JSON and SSE), admin keys, every owner's jobs, batch mates, and
retry. The anonymous admin (auth off) and 429 counts run in process on their own Redis
database, where no worker drains the queue."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from harness.api_client import Api, new_owner
from harness.inprocess import SLEEP_QUEUE_LIMIT, inprocess_settings, serve_in_process
from host.devices import Usage
from jobstore.api_keys import create_key
from tuning.deployment import Deployment, wait_until
from workers.sampler import WorkerMetrics


@pytest.fixture
def rclient(deployment: Deployment) -> redis.Redis:
    """The shared deployment's own Redis (conftest's `deployment`), not the session's."""
    return redis.Redis.from_url(deployment.redis_url, decode_responses=True)


def _owner(dep: Deployment, name: str, *, admin: bool = False) -> Api:
    client = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    name = f"{name}{time.monotonic_ns() % 10**9}"
    return Api(dep.base_url, create_key(client, name, admin=admin))


@pytest.fixture(scope="module")
def admin(deployment: Deployment) -> Api:
    return _owner(deployment, "admin", admin=True)


def _overview(admin: Api) -> dict[str, Any]:
    r = admin.http.get("/v1/admin/overview")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _pipeline(overview: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [p for p in overview["pipelines"] if p["pipeline"] == name]
    return dict(found)


def _worker(overview: dict[str, Any], pipeline: str) -> dict[str, Any]:
    (found,) = [w for w in overview["workers"] if w["pipeline"] == pipeline]
    return dict(found)


def test_overview_shows_queues_running_workers_rates_and_gpus(
    deployment: Deployment, admin: Api, rclient: redis.Redis
) -> None:
    first = _overview(admin)
    assert first["devices"] == []  # this machine's workers read no GPU
    sleep_worker = _worker(first, "sleep")
    assert sleep_worker["up"] and sleep_worker["device"] == "cpu"
    assert sleep_worker["instance"] == 0 and sleep_worker["heartbeat_age_s"] < 5

    owner = _owner(deployment, "viewer")
    long = owner.submit("sleep", steps=200, step_ms=25)
    wait_until(lambda: owner.get(long["id"])["status"] == "running", timeout_s=10)
    waiting = owner.submit("sleep", priority="high", steps=1)
    now = _overview(admin)
    sleep = _pipeline(now, "sleep")
    assert sleep["kind"] == "sleep" and sleep["workers"] == 1
    assert sleep["running"] == 1
    assert sleep["queued"] == {"high": 1, "normal": 0, "low": 0, "batch": 0}
    assert sleep["queued_total"] == 1
    assert {"kind": "sleep", "queued": 1, "max_queued": 1000} in now["kinds"]
    # The heartbeat (every 2 s) carries the worker's jobs in flight and its batch now.
    wait_until(lambda: _worker(_overview(admin), "sleep")["batch_size"] == 1, timeout_s=5)
    assert _worker(_overview(admin), "sleep")["in_flight"] == 1

    echoes = [owner.submit("echo", text=f"e{i}", sleep_ms=20) for i in range(3)]
    for job in echoes:
        assert owner.wait(job["id"])["status"] == "succeeded"
    for job in (waiting, long):
        assert owner.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200

    # Workers write their counts once per `metrics_flush_s`.
    wait_until(lambda: _pipeline(_overview(admin), "echo")["end_to_end"]["count"] >= 3)
    echo = _pipeline(_overview(admin), "echo")
    assert echo["ended"]["succeeded"] >= 3 and echo["jobs_per_s"] > 0
    assert echo["queue_wait"]["count"] >= 3 and echo["queue_wait"]["p50_ms"] is not None
    assert 0 < echo["end_to_end"]["p50_ms"] <= echo["end_to_end"]["p95_ms"] < 10_000
    assert echo["rejected"] == 0

    # A GPU reading as a worker with NVML stores it: the overview shows it.
    reading = Usage("gpu:0", "GPU-1c2f", "NVIDIA A100-SXM4-40GB", 3 * 2**30, 40 * 2**30, 0.75)
    assert WorkerMetrics(rclient, "gpu:0", read={"gpu:0": reading}.get, host="g1").sample_once()
    (gpu,) = _overview(admin)["devices"]
    assert gpu == {
        "host": "g1",
        "device": "gpu:0",
        "uuid": "GPU-1c2f",
        "name": "NVIDIA A100-SXM4-40GB",
        "utilization": 0.75,
        "memory_used_bytes": 3 * 2**30,
        "memory_total_bytes": 40 * 2**30,
    }


def test_overview_stream_pushes_snapshots(admin: Api) -> None:
    snapshots = 0
    params = {"interval_s": 0.5}
    with admin.http.stream("GET", "/v1/admin/overview/stream", params=params) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "overview":
                assert '"pipelines"' in line
                snapshots += 1
                if snapshots == 2:
                    break


def test_admin_routes_need_an_admin_key(deployment: Deployment, admin: Api) -> None:
    plain = _owner(deployment, "plain")
    for path in ("/v1/admin/overview", "/v1/admin/jobs", "/v1/admin/overview/stream"):
        r = plain.http.get(path)
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "forbidden"
        assert "not an admin key" in r.json()["error"]["message"]
        assert httpx.get(deployment.base_url + path).status_code == 401
        unknown = {"Authorization": "Bearer mmq_nobody"}
        assert httpx.get(deployment.base_url + path, headers=unknown).status_code == 401
    assert admin.http.get("/v1/admin/jobs").status_code == 200


def test_admin_lists_every_owners_jobs_with_filters(deployment: Deployment, admin: Api) -> None:
    since = time.time()
    alice, bob = _owner(deployment, "alice"), _owner(deployment, "bob")
    a = [alice.wait(alice.submit("echo", text=f"a{i}")["id"]) for i in range(2)]
    b = bob.wait(bob.submit("echo", text="b", fail=True)["id"])
    s = bob.wait(bob.submit("sleep", steps=1)["id"])
    mine = {j["id"] for j in (*a, b, s)}

    def ids(**params: Any) -> list[str]:
        r = admin.http.get("/v1/admin/jobs", params={"since": since, **params})
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["data"] if j["id"] in mine]

    newest_first = [s["id"], b["id"], a[1]["id"], a[0]["id"]]
    assert ids() == newest_first
    assert ids(kind="echo") == newest_first[1:]
    assert ids(pipeline="sleep") == [s["id"]]
    assert ids(status="failed") == [b["id"]]
    assert ids(owner=a[0]["owner"]) == [a[1]["id"], a[0]["id"]]
    assert ids(until=a[1]["created_at"]) == [a[1]["id"], a[0]["id"]]
    assert not ids(since=time.time() + 60)
    paged: list[str] = []
    cursor = None
    while True:
        params = {"limit": 1, "since": since, **({"cursor": cursor} if cursor else {})}
        page = admin.http.get("/v1/admin/jobs", params=params).json()
        paged += [j["id"] for j in page["data"]]
        if not (cursor := page["next_cursor"]):
            break
    assert [i for i in paged if i in mine] == newest_first
    views = admin.http.get("/v1/admin/jobs", params={"since": since}).json()["data"]
    assert {v["owner"] for v in views if v["id"] in mine} == {a[0]["owner"], b["owner"]}
    # An owner's own listing takes the same new filters, and stays theirs.
    own = bob.http.get("/v1/jobs", params={"pipeline": "echo", "since": since}).json()["data"]
    assert [j["id"] for j in own] == [b["id"]]


def test_job_view_names_its_worker_and_batch_mates(deployment: Deployment, admin: Api) -> None:
    owner = _owner(deployment, "batcher")
    # One runner: while the blocker runs, the next two wait in one group and batch.
    blocker = owner.submit("echo", text="block", group="block", sleep_ms=800)
    wait_until(lambda: owner.get(blocker["id"])["status"] == "running", timeout_s=10)
    with ThreadPoolExecutor(2) as pool:
        mates = list(pool.map(lambda i: owner.submit("echo", text=f"m{i}", group="m"), range(2)))
    done = [owner.wait(j["id"]) for j in mates]
    assert [j["output"]["batch_size"] for j in done] == [2, 2]
    first, second = done
    assert first["batch"]["id"] == second["batch"]["id"]
    assert first["batch"]["size"] == 2
    assert sorted(first["batch"]["job_ids"]) == sorted(j["id"] for j in mates)
    assert first["worker"] and first["worker"].startswith("echo-0@")
    alone = owner.wait(blocker["id"])["batch"]
    assert alone["size"] == 1 and alone["job_ids"] == [blocker["id"]]
    # An admin sees another owner's job, with the same fields.
    seen = admin.http.get(f"/v1/admin/jobs/{first['id']}").json()
    assert seen["batch"] == first["batch"] and seen["worker"] == first["worker"]
    assert admin.http.get("/v1/admin/jobs/job_nope").status_code == 404


def test_retry_runs_an_ended_job_again(deployment: Deployment, api: Api) -> None:
    ended = api.wait(api.submit("echo", text="again", priority="low")["id"])
    r = api.http.post(f"/v1/jobs/{ended['id']}/retry")
    assert r.status_code == 202, r.text
    retried = r.json()
    assert retried["id"] != ended["id"] and r.headers["Location"] == retried["urls"]["self"]
    for name in ("kind", "model", "input", "priority", "owner"):
        assert retried[name] == ended[name], name
    assert api.wait(retried["id"])["output"]["text"] == "again"

    running = api.submit("sleep", steps=100, step_ms=25)
    wait_until(lambda: api.get(running["id"])["status"] == "running", timeout_s=10)
    r = api.http.post(f"/v1/jobs/{running['id']}/retry")
    assert r.status_code == 409 and r.json()["error"]["type"] == "conflict"
    other = new_owner(deployment.redis_url, deployment.base_url, f"o{time.monotonic_ns()}")
    assert other.http.post(f"/v1/jobs/{ended['id']}/retry").status_code == 404
    api.http.post(f"/v1/jobs/{running['id']}/cancel")


def test_an_admin_follows_cancels_and_retries_any_owners_job(
    deployment: Deployment, admin: Api, api: Api
) -> None:
    """The job routes take an admin key for any owner's job (the console's job page);
    another plain key still gets 404."""
    running = api.submit("sleep", steps=200, step_ms=25)
    wait_until(lambda: admin.get(running["id"])["status"] == "running", timeout_s=10)
    assert admin.get(running["id"])["owner"] == api.get(running["id"])["owner"]
    other = new_owner(deployment.redis_url, deployment.base_url, f"o{time.monotonic_ns()}")
    assert other.http.get(f"/v1/jobs/{running['id']}").status_code == 404
    assert other.http.post(f"/v1/jobs/{running['id']}/cancel").status_code == 404
    assert admin.http.post(f"/v1/jobs/{running['id']}/cancel").status_code == 200
    ended = admin.wait(running["id"])
    assert ended["status"] == "canceled"
    with admin.http.stream("GET", f"/v1/jobs/{running['id']}/events") as events:
        assert events.status_code == 200
        assert '"canceled"' in events.read().decode()
    again = admin.http.post(f"/v1/jobs/{running['id']}/retry")
    assert again.status_code == 202, again.text
    assert again.json()["owner"] == ended["owner"]  # the job's owner's, not the admin's
    api.http.post(f"/v1/jobs/{again.json()['id']}/cancel")


@pytest.mark.anyio
async def test_auth_off_caller_is_admin_and_429s_are_counted(
    redis_url: str, tmp_path: Path
) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/7"  # no worker drains this database's queues
    redis.Redis.from_url(url).flushdb()
    settings = inprocess_settings(url, tmp_path, auth=False)
    async with serve_in_process(settings) as served, served.client() as anonymous:
        body = {"kind": "sleep", "input": {"steps": 1}}
        codes = [(await anonymous.post("/v1/jobs", json=body)).status_code for _ in range(3)]
        assert codes == [202] * SLEEP_QUEUE_LIMIT + [429]
        r = await anonymous.get("/v1/admin/overview", params={"minutes": 1})
        assert r.status_code == 200, r.text
        overview = r.json()
        (sleep,) = [p for p in overview["pipelines"] if p["pipeline"] == "sleep"]
        assert sleep["rejected"] == 1 and sleep["queued_total"] == SLEEP_QUEUE_LIMIT
        assert sleep["running"] == 0 and sleep["jobs_per_s"] == 0
        assert sleep["end_to_end"] == {"count": 0, "p50_ms": None, "p95_ms": None}
        assert overview["workers"] == [] and overview["devices"] == []
        assert 60 <= overview["window_s"] <= 120
        # A known key keeps its owner with auth off, and is no admin unless made one.
        async with served.owner("plainkey") as plain:
            assert (await plain.get("/v1/admin/overview")).status_code == 403
