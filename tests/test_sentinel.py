"""Redis Sentinel: `common.redis_client` reads sentinel:// URLs, and a real deployment (API,
worker, reaper on a primary, a replica and three sentinels) rides out a SIGKILL of the
primary: 202 or 503 with Retry-After meanwhile, never 500; no process restarted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from kombu import Connection

from broker import kombu_redis
from broker.celery_app import make_celery
from common import redis_client
from common.redis_client import (
    BlockingSentinelConnectionPool,
    RedisUrlError,
    SentinelUrl,
    parse_sentinel_url,
)
from harness.sentinel import SentinelGroup
from host.launcher import mmq_command
from jobs.settings import load_settings
from tuning.deployment import REPO, Deployment, serving, status_events, wait_until

RECOVERY_BOUND_S = 120.0
"""A guard against a failover that never comes: Sentinel acts in seconds here
(`down-after-milliseconds` 2000); how soon the first 202 comes is measured by
`python -m bench.faults --scenarios failover-memory`, not asserted here."""

ECHO_ONLY = """
[kinds.echo]
schema = "harness.pipelines:EchoInput"

[pipelines.echo]
kind = "echo"
impl = "harness.pipelines:EchoPipeline"
max_batch = 8
max_wait_ms = 20
concurrency = 4
"""
"""One pipeline, so that its one worker makes `/readyz` 200."""


def test_a_sentinel_url_names_sentinels_master_db_and_credentials() -> None:
    url = "sentinel://us%40r:p%3Ass@h1:26380,h2,[::1]:26381/my-master/3?socket_timeout=1.5"
    parsed = parse_sentinel_url(url)
    assert parsed == SentinelUrl(
        sentinels=(("h1", 26380), ("h2", 26379), ("::1", 26381)),
        master_name="my-master",
        db=3,
        username="us@r",
        password="p:ss",
        socket_timeout_s=1.5,
    )
    assert "p:ss" not in repr(parsed)
    assert parse_sentinel_url("sentinel://h/m/") == SentinelUrl((("h", 26379),), "m")
    with_sentinel_auth = parse_sentinel_url("sentinel://:pw@h/m?sentinel_password=spw")
    assert (with_sentinel_auth.password, with_sentinel_auth.sentinel_password) == ("pw", "spw")
    assert with_sentinel_auth.sentinel_kwargs()["password"] == "spw"
    assert with_sentinel_auth.master_kwargs()["password"] == "pw"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379", "names the master group"),
        ("sentinel://h1:26379/", "names the master group"),
        ("sentinel://h1:26379/m/x", "database"),
        ("sentinel://h1:26379/m/0/extra", "/MASTER or /MASTER/DB"),
        ("sentinel://h1:nope/m", "bad sentinel address"),
        ("sentinel://h1:99999/m", "bad sentinel address"),
        ("sentinel://h1,,h2/m", "HOST[:PORT]"),
        ("sentinel:///m", "HOST[:PORT]"),
        ("sentinel://h1/m?master=x", "unknown Sentinel URL option(s) master"),
        ("sentinel://h1/m?socket_timeout=-1", "socket_timeout"),
        ("http://h1:6379/0", "must start with redis://"),
        ("localhost:6379", "no scheme"),
        ("redis://h1:6379/0?socket_timeout=abc", "bad Redis URL"),
    ],
)
def test_a_bad_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError, match=None) as caught:
        redis_client.check_url(url)
    assert says in str(caught.value)


def test_mmq_stops_at_a_bad_url_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "MMQ_REDIS_URL": "sentinel://h1/mymaster/x", "MMQ_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        mmq_command("keys", "create", "x"), env=env, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "MMQ_REDIS_URL: the database in a Sentinel URL is a number" in done.stderr


def test_the_broker_on_sentinel_is_mmqs_transport_over_every_sentinel() -> None:
    url = "sentinel://:p%40ss@127.0.0.1:1,127.0.0.1:2/mymaster/2"
    settings = kombu_redis.broker_for(url)
    assert settings.url == "sentinel://:p%40ss@127.0.0.1:1/2;sentinel://:p%40ss@127.0.0.1:2/2"
    assert settings.transport == kombu_redis.SENTINEL_TRANSPORT
    assert settings.options["master_name"] == "mymaster"
    assert kombu_redis.broker_for("redis://h:1/0").transport == kombu_redis.TRANSPORT
    assert kombu_redis.broker_for("unix:///tmp/r.sock?db=3").url == (
        "redis+socket:///tmp/r.sock?virtual_host=3"
    )
    app = make_celery(load_settings(redis_url=url))
    conn: Connection = app.connection_for_write()
    assert conn.transport_cls == kombu_redis.SENTINEL_TRANSPORT
    assert (conn.password, conn.virtual_host) == ("p@ss", "2")
    # After a connection error kombu moves on to the "next" URL: it must keep mmq's
    # transport (and the channel still asks both sentinels: they are its alternates).
    conn.maybe_switch_next()
    assert conn.transport_cls == kombu_redis.SENTINEL_TRANSPORT
    assert (conn.password, conn.virtual_host, len(conn.alt)) == ("p@ss", "2", 2)
    app.close()


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path_factory.mktemp("sentinel"), password="s3cret") as started:
        yield started


@pytest.mark.anyio
async def test_the_api_client_on_sentinel_waits_for_a_free_connection(
    group: SentinelGroup,
) -> None:
    client = redis_client.connect_async(group.url, max_connections=1, timeout_s=5)
    try:
        assert isinstance(client.connection_pool, BlockingSentinelConnectionPool)
        # One connection: the PING waits for the BLPOP's instead of failing at once.
        assert await asyncio.gather(client.blpop(["nothing"], timeout=0.3), client.ping()) == [
            None,
            True,
        ]
    finally:
        await redis_client.close_async(client)
    impatient = redis_client.connect_async(group.url, max_connections=1, timeout_s=0.1)
    try:
        with pytest.raises(redis.ConnectionError):
            await asyncio.gather(impatient.blpop(["nothing"], timeout=1), impatient.ping())
    finally:
        await redis_client.close_async(impatient)


@dataclass
class Answer:
    at_s: float
    status: int
    retry_after: str | None


def test_clients_follow_the_master_across_a_failover(group: SentinelGroup, tmp_path: Path) -> None:
    r = redis_client.connect(group.url)
    assert r.ping() and r.connection_pool.connection_kwargs["db"] == 0
    dep = Deployment(group.url, tmp_path)
    dep.config_path.write_text(ECHO_ONLY)
    with serving(dep):
        procs = [dep.start_api(), dep.start_worker("echo"), dep.start_reaper()]
        procs.append(dep.start_scheduler())
        pids = [p.process.pid for p in procs]
        # The reaper and the scheduler check Redis once at start (and exit if it does not
        # answer): let them start before the kill, as a deployment's long-running ones
        # would have.
        wait_until(lambda: "reaper sweeping every" in procs[2].log(), procs[2], timeout_s=60)
        wait_until(lambda: "scheduler: a step every" in procs[3].log(), procs[3], timeout_s=60)
        http = _client(dep)
        before = [_submit(http) for _ in range(3)]
        assert all(_wait_succeeded(http, job_id) for job_id in before)
        wait_until(lambda: http.get("/readyz").status_code == 200, timeout_s=20)

        # A job still running at the kill: its end is written once the new master answers.
        in_flight = _submit(http, sleep_ms=1500)
        wait_until(lambda: http.get(f"/v1/jobs/{in_flight}").json()["status"] == "running")
        killed_at = time.monotonic()
        group.kill_primary()
        accepted = _submit_until_accepted(http, killed_at)

        group.wait_promoted(timeout_s=30)
        after = [accepted, *(_submit(http) for _ in range(3))]
        for job_id in after:
            assert _wait_succeeded(http, job_id), http.get(f"/v1/jobs/{job_id}").text
        print(f"first job after the kill succeeded: {time.monotonic() - killed_at:.2f}s")
        for job_id in after:  # each ran once, on the new master
            assert status_events(r, job_id) == ["queued", "running", "succeeded"]
        assert _wait_succeeded(http, in_flight), http.get(f"/v1/jobs/{in_flight}").text
        assert status_events(r, in_flight).count("succeeded") == 1
        # Its task message was acknowledged, through the channel it came from.
        wait_until(lambda: r.hlen(kombu_redis.UNACKED) == 0, timeout_s=10)
        _check_the_api_after_failover(http)

        _ride_out_a_switch_over(group, http, r)
        assert [p.process.pid for p in procs if p.alive()] == pids  # nothing restarted


def _ride_out_a_switch_over(group: SentinelGroup, http: httpx.Client, r: redis.Redis) -> None:
    """A planned switch-over (`SENTINEL FAILOVER`) while a client submits all along:
    the master is demoted while every process holds connections to it (Sentinel closes
    them; a write that reaches it still is refused with READONLY, which redis-py takes
    for a lost connection), and the next connection goes to the new master."""
    group.restart_primary()
    answers: list[Answer] = []
    accepted: list[str] = []
    done = threading.Event()

    def submit_all_along() -> None:
        started = time.monotonic()
        while not done.is_set():
            posted = http.post("/v1/jobs", json={"kind": "echo", "input": {"text": "switch"}})
            at_s = time.monotonic() - started
            answers.append(Answer(at_s, posted.status_code, posted.headers.get("retry-after")))
            if posted.status_code == 202:
                accepted.append(str(posted.json()["id"]))
            time.sleep(0.05)

    submitter = threading.Thread(target=submit_all_along, daemon=True)
    submitter.start()
    try:
        group.switch_over()
        group.wait_master(group.primary.port)
        # The demoted master takes writes until Sentinel has made it a replica, and its
        # demotion drops them: what `memory` durability may lose (docs/deployment/sentinel.md).
        group.wait_replica(group.replica.port)
        time.sleep(1)  # and a while after
    finally:
        done.set()
        submitter.join(timeout=30)
    print(f"\nSENTINEL FAILOVER: {[(round(a.at_s, 1), a.status) for a in answers]}")
    assert {a.status for a in answers} <= {202, 503}, answers
    assert all(a.retry_after for a in answers if a.status == 503), answers
    after = _submit(http)
    assert _wait_succeeded(http, after), http.get(f"/v1/jobs/{after}").text
    assert status_events(r, after) == ["queued", "running", "succeeded"]
    ends = {j: http.get(f"/v1/jobs/{j}").json().get("status", "lost") for j in accepted}
    print("jobs accepted during the switch-over:", Counter(ends.values()))


def _client(dep: Deployment) -> httpx.Client:
    """An API client with a key from `mmq keys create` (the CLI on Sentinel too)."""
    key = subprocess.run(
        mmq_command("keys", "create", "sentinel"), env=dep.env, cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    return httpx.Client(
        base_url=dep.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=20
    )


def _check_the_api_after_failover(http: httpx.Client) -> None:
    wait_until(lambda: http.get("/readyz").status_code == 200, timeout_s=20)
    assert http.get("/metrics").status_code == 200
    # The API's pub/sub follows the new master too: a waiting request ends with the job
    # (1 s, still running as the wait starts), heard as it ends; a missed end would leave
    # the wait to run out (60 s) and answer 202 with the job as it was.
    job_id = _submit(http, sleep_ms=1000)
    waited = http.get(f"/v1/jobs/{job_id}", headers={"Prefer": "wait=60"}, timeout=90)
    assert waited.status_code == 200 and waited.json()["status"] == "succeeded", waited.text
    assert waited.elapsed.total_seconds() < 30


def _submit(http: httpx.Client, sleep_ms: int = 0) -> str:
    body = {"kind": "echo", "input": {"text": "hi", "sleep_ms": sleep_ms}}
    answer = http.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _submit_until_accepted(http: httpx.Client, killed_at: float) -> str:
    """Submit (and read /readyz) every 0.2 s from the kill until a submit is accepted;
    check what the API answered meanwhile; returns the accepted job's id."""
    answers: list[Answer] = []
    readyz: list[int] = []
    while time.monotonic() - killed_at < RECOVERY_BOUND_S:
        posted = http.post("/v1/jobs", json={"kind": "echo", "input": {"text": "again"}})
        at_s = time.monotonic() - killed_at
        answers.append(Answer(at_s, posted.status_code, posted.headers.get("retry-after")))
        if posted.status_code == 202:
            break
        readyz.append(http.get("/readyz").status_code)
        time.sleep(0.2)
    print(f"\nSIGKILL of the primary -> first 202: {answers[-1].at_s:.2f}s; answers: "
          f"{[(round(a.at_s, 1), a.status) for a in answers]}")  # fmt: skip
    assert answers[-1].status == 202, f"no submit accepted in {RECOVERY_BOUND_S}s: {answers}"
    assert {a.status for a in answers} <= {202, 503}, answers
    assert all(a.retry_after for a in answers if a.status == 503), answers
    assert 503 in readyz, readyz  # no primary reachable for a while: not ready
    return str(posted.json()["id"])


def _wait_succeeded(http: httpx.Client, job_id: str, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = http.get(f"/v1/jobs/{job_id}", headers={"Prefer": "wait=5"})
        if answer.status_code == 200 and answer.json()["status"] in ("succeeded", "failed"):
            return bool(answer.json()["status"] == "succeeded")
        time.sleep(0.1)
    return False
