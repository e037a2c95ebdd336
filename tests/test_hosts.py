"""A deployment across hosts (network namespaces, harness/netns.py) survives
partitions: Redis, the reaper and the scheduler on one host, the API on another, a sleep
worker on each of two more; the tests are the client, in the root namespace, over the
hosts' addresses.

- A worker host cut off while it runs a job: its lease runs out, the reaper requeues the
  job and the other worker finishes it; when the link returns, what the cut-off run still
  sends is refused (its events are fenced by its lease, its end by the lease check), the
  cut-off worker gives the job up and takes new work.
- The API host cut off: clients get connection errors, the job goes on, and once the link
  returns an SSE stream resumed with `Last-Event-ID` delivers the events missed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from common.sse import parse_lines
from harness.netns import NetHost, Network, unavailable
from host.redis_server import server_binary
from jobs import keys
from jobs.states import TERMINAL_VALUES
from jobstore.api_keys import create_key
from jobstore.codec import text_map
from tuning.deployment import Deployment, Proc, answers, serving, status_events, wait_until

REDIS_PORT = 6379
API_PORT = 8000
LEASE_ENV = {
    "MMQ_LEASE__TTL_S": "3",
    "MMQ_LEASE__HEARTBEAT_S": "0.5",
    "MMQ_LEASE__REAPER_INTERVAL_S": "0.5",
    "MMQ_API__KEEPALIVE_S": "1",
}


@dataclass
class Cluster:
    net: Network
    dep: Deployment
    api_host: NetHost
    workers: dict[str, tuple[NetHost, Proc]]
    """Host name -> the host and its worker process."""
    r: redis.Redis
    key: str

    @property
    def base_url(self) -> str:
        return f"http://{self.api_host.address}:{API_PORT}"

    def client(self, timeout_s: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.key}"}
        return httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout_s, trust_env=False
        )

    def submit(self, **inp: Any) -> str:
        with self.client() as http:
            r = http.post("/v1/jobs", json={"kind": "sleep", "input": inp})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    def job(self, job_id: str) -> dict[str, str]:
        return text_map(self.r.hgetall(keys.job(job_id)))

    def wait_status(self, job_id: str, statuses: set[str], timeout_s: float) -> dict[str, str]:
        wait_until(lambda: self.job(job_id).get("status") in statuses, timeout_s=timeout_s)
        return self.job(job_id)

    def stream(self, job_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, type, data) of each event in the job's stream, in order."""
        entries: list[tuple[str, dict[str, str]]] = self.r.xrange(keys.job_events(job_id))  # type: ignore[assignment]  # redis-py: a union of both APIs
        return [(i, e["type"], json.loads(e["data"])) for i, e in entries]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason=f"no test hosts (network namespaces): {reason}")
    net = Network()
    try:
        redis_host, api_host = net.add_host("redis"), net.add_host("api")
        worker_hosts = [net.add_host("w0"), net.add_host("w1")]
        redis_url = f"redis://{redis_host.address}:{REDIS_PORT}/0"
        dep = Deployment(redis_url, tmp_path_factory.mktemp("hosts"), env_overrides=LEASE_ENV)
        with serving(dep):
            yield _start(net, dep, redis_host, api_host, worker_hosts)
    finally:
        net.close()


def _start(
    net: Network, dep: Deployment, redis_host: NetHost, api_host: NetHost, hosts: list[NetHost]
) -> Cluster:
    server = dep.launch(
        "redis",
        [server_binary(), "--bind", redis_host.address, "--port", str(REDIS_PORT),
         "--protected-mode", "no", "--save", "", "--appendonly", "no",
         "--dir", str(dep.tmp)],
        wrap=redis_host.wrap(),
    )  # fmt: skip
    r = redis.Redis(
        host=redis_host.address, port=REDIS_PORT, decode_responses=True, socket_timeout=5,
        socket_connect_timeout=1,
    )  # fmt: skip
    wait_until(lambda: answers(r), server, timeout_s=15)
    api = dep.spawn(
        "api", "api", wrap=api_host.wrap(),
        env={"MMQ_API__HOST": api_host.address, "MMQ_API__PORT": str(API_PORT)},
    )  # fmt: skip
    dep.spawn("reaper", "reaper", wrap=redis_host.wrap())
    dep.spawn("scheduler", "scheduler", wrap=redis_host.wrap())
    workers = {
        host.name: (host, dep.spawn(f"worker-{host.name}", "worker", "--pipeline", "sleep",
                                    wrap=host.wrap()))
        for host in hosts
    }  # fmt: skip
    cluster = Cluster(net, dep, api_host, workers, r, create_key(r, "hosts"))
    wait_until(lambda: _healthy(cluster), api, timeout_s=45)
    for _, proc in workers.values():
        wait_until(lambda proc=proc: "ready." in proc.log(), proc, timeout_s=45)
    return cluster


def _healthy(cluster: Cluster) -> bool:
    try:
        with cluster.client(timeout_s=1) as http:
            return http.get("/healthz").status_code == 200
    except httpx.HTTPError:
        return False


def _worker_of(cluster: Cluster, job_id: str) -> str:
    """The host whose worker runs (or ran) the job last ('' for none yet); a worker's name
    ends with its pid."""
    pid = cluster.job(job_id).get("worker", "").rpartition(".")[2]
    for name, (_, proc) in cluster.workers.items():
        if str(proc.process.pid) == pid:
            return name
    return ""


def test_a_cut_off_worker_loses_its_job_to_the_other_host_and_serves_again(
    cluster: Cluster,
) -> None:
    steps, step_ms = 16, 250
    jobs = [cluster.submit(steps=steps, step_ms=step_ms) for _ in range(2)]
    for job_id in jobs:
        cluster.wait_status(job_id, {"running"}, timeout_s=15)
    wait_until(lambda: {_worker_of(cluster, j) for j in jobs} == set(cluster.workers), timeout_s=10)
    cut_job = jobs[0]
    cut_name = _worker_of(cluster, cut_job)
    (other_name,) = set(cluster.workers) - {cut_name}
    host, cut_proc = cluster.workers[cut_name]
    other_pid = cluster.workers[other_name][1].process.pid
    wait_until(lambda: any(t == "progress" for _, t, _ in cluster.stream(cut_job)), timeout_s=10)

    cut_at = time.time()
    with cluster.net.partitioned(host):
        # The lease runs out (3 s), the reaper requeues, the other host takes it over once
        # its own job is done; the cut-off run goes on meanwhile, its writes held.
        wait_until(lambda: status_events(cluster.r, cut_job).count("running") == 2, timeout_s=20)
        time.sleep(1.0)  # the cut-off run has more to send when the link returns

    ended = cluster.wait_status(cut_job, set(TERMINAL_VALUES), timeout_s=20)
    assert ended["status"] == "succeeded", ended
    assert json.loads(ended["output"])["pid"] == other_pid
    statuses = status_events(cluster.r, cut_job)
    assert statuses == ["queued", "running", "queued", "running", "succeeded"], statuses

    # After the second `running`, only the second run's events: its steps from 1 in order,
    # its output, its end. A late event of the first run would break the sequence.
    stream = cluster.stream(cut_job)
    requeued_at = next(
        float(ts) for ts, t, d in _timed(cluster, cut_job) if t == "status" and d == "queued"
    )
    print(f"requeued {requeued_at - cut_at:.2f} s after the cut")
    assert requeued_at - cut_at < 3 + 3  # the lease's TTL, then a sweep or two
    second = [i for i, (_, t, d) in enumerate(stream) if t == "status" and d["status"] == "running"]
    after = stream[second[1] + 1 :]
    progress = [d["step"] for _, t, d in after if t == "progress"]
    assert progress == list(range(1, steps + 1)), after
    assert [t for _, t, _ in after if t != "progress"] == ["output", "status"], after

    # The cut-off worker noticed, dropped the run, and is back at work.
    # (It may learn it from a failed heartbeat, the lease having run out meanwhile, or
    # from a refused renewal once the link is back: both set the run's `lost`.)
    gave_up = f"job {cut_job}: lease lost, its result here is dropped"
    wait_until(lambda: gave_up in cut_proc.log(), cut_proc, timeout_s=20)
    assert "no longer holds the lease" in cut_proc.log()  # the fence dropped its late events
    assert cut_proc.alive()
    _serves_again(cluster, cut_name)
    other = jobs[1]
    assert status_events(cluster.r, other) == ["queued", "running", "succeeded"]


def _timed(cluster: Cluster, job_id: str) -> list[tuple[str, str, str]]:
    """(ts, type, status or '') of each event of the job after its first."""
    entries: list[tuple[str, dict[str, str]]] = cluster.r.xrange(keys.job_events(job_id))  # type: ignore[assignment]  # redis-py: a union of both APIs
    return [(e["ts"], e["type"], json.loads(e["data"]).get("status", "")) for _, e in entries[1:]]


def _serves_again(cluster: Cluster, name: str) -> None:
    """Short jobs until one runs on worker `name` (bounded): it takes and finishes work."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job_ids = [cluster.submit(steps=2, step_ms=100) for _ in range(2)]
        for job_id in job_ids:
            ended = cluster.wait_status(job_id, set(TERMINAL_VALUES), timeout_s=20)
            assert ended["status"] == "succeeded", ended
            assert status_events(cluster.r, job_id) == ["queued", "running", "succeeded"]
        if name in {_worker_of(cluster, j) for j in job_ids}:
            return
    raise AssertionError(f"worker {name} took no job in 30 s after its link returned")


def test_a_cut_off_api_host_refuses_clients_while_jobs_run_and_sse_resumes_after(
    cluster: Cluster,
) -> None:
    job_id = cluster.submit(steps=16, step_ms=250)
    seen: list[str] = []
    with cluster.client() as http, http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200
        for message in parse_lines(response.iter_lines()):
            assert message.id is not None
            seen.append(message.id)
            if message.event == "progress":
                break
    last_id = seen[-1]

    with cluster.net.partitioned(cluster.api_host):
        with pytest.raises(httpx.TransportError), cluster.client(timeout_s=1) as http:
            http.get(f"/v1/jobs/{job_id}")
        # The workers do not need the API: the job runs on and ends meanwhile.
        ended = cluster.wait_status(job_id, set(TERMINAL_VALUES), timeout_s=20)
        assert ended["status"] == "succeeded", ended

    wait_until(lambda: _healthy(cluster), timeout_s=30)
    headers = {"Last-Event-ID": last_id}
    with cluster.client() as http:
        response = http.get(f"/v1/jobs/{job_id}/events", headers=headers)
    assert response.status_code == 200, response.text
    resumed = list(parse_lines(iter(response.text.splitlines())))
    stored = cluster.stream(job_id)
    missed = [i for i, _, _ in stored][len(seen) :]
    assert stored[len(seen) - 1][0] == last_id
    assert [m.id for m in resumed] == missed
    assert resumed[-1].event == "status"
    assert json.loads(resumed[-1].data)["data"] == {"status": "succeeded"}
