"""Per-key quotas against real processes: jobs queued at once, jobs per window, jobs
released at once and cost per window, exact under concurrent submits, given back
whatever way a job leaves the queue (started, canceled, expired, a worker SIGKILLed and
its job queued again), OpenAI's rate-limit headers (requests and tokens), the official
client's retry on 429, and one key never counting against another."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from harness.api_client import Api, limited_owner
from harness.audio import silence
from host.redis_server import RedisServer
from jobs import keys
from jobstore.api_keys import create_key
from jobstore.quotas import KeyLimits, set_limits
from tuning.deployment import Deployment, flush, running, serving, wait_until

WINDOW_S = 3
IDLE = """
[pipelines.idle]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
"""
"""A pipeline of the sleep kind that no worker serves: its jobs stay queued."""
LLM = """
[pipelines.llm]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = "no-worker-serves-it"

[pipelines.embed]
kind = "embed"
impl = "pipelines.embed:EmbedPipeline"
"""
"""LLM and embedding pipelines that no worker serves: their jobs are admitted (their cost
counted) and stay queued."""


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    env = {
        "MMQ_QUOTAS__WINDOW_S": str(WINDOW_S),
        "MMQ_LEASE__TTL_S": "1.5",
        "MMQ_LEASE__HEARTBEAT_S": "0.3",
        "MMQ_LEASE__REAPER_INTERVAL_S": "0.2",
    }
    echo = {"echo_concurrency": 4, "echo_max_batch": 1, "echo_max_wait_ms": 0}
    tmp = tmp_path_factory.mktemp("quotas")
    with running(redis_url, tmp, env, ["sleep", "echo"], IDLE + LLM, echo) as deployment:
        yield deployment


@pytest.fixture
def r(dep: Deployment) -> redis.Redis:
    return redis.Redis.from_url(dep.redis_url, decode_responses=True)


def _owner(dep: Deployment, r: redis.Redis, **limits: int) -> Api:
    return limited_owner(dep.redis_url, dep.base_url, **limits)


def _quota(api: Api) -> dict[str, Any]:
    return dict(api.http.get("/v1/whoami").json()["quota"])


def _sleep(api: Api, model: str = "idle", **extra: Any) -> httpx.Response:
    inp = {"model": model, "steps": 1, "step_ms": 10}
    return api.http.post("/v1/jobs", json={"kind": "sleep", "input": inp, **extra})


def test_jobs_queued_is_exact_under_concurrent_submits(dep: Deployment, r: redis.Redis) -> None:
    alice = _owner(dep, r, max_queued=5)
    headers = {"Authorization": f"Bearer {alice.key}"}
    body = {"kind": "sleep", "input": {"model": "idle", "steps": 1}}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=dep.base_url, headers=headers, timeout=30) as c:
            return await asyncio.gather(*(c.post("/v1/jobs", json=body) for _ in range(40)))

    answers = asyncio.run(burst())
    accepted = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code == 429]
    assert len(accepted) == 5 and len(refused) == 35
    error = refused[0].json()["error"]
    assert error["type"] == "quota_exceeded" and "jobs queued: 5 of 5" in error["message"]
    assert int(refused[0].headers["retry-after"]) >= 1
    assert _quota(alice)["queued"] == 5
    bob = _owner(dep, r, max_queued=1)  # another key's jobs never count against bob
    assert _sleep(bob).status_code == 202
    for answer in accepted[:2]:
        alice.http.post(f"/v1/jobs/{answer.json()['id']}/cancel")
    assert _quota(alice)["queued"] == 3
    assert [_sleep(alice).status_code for _ in range(3)] == [202, 202, 429]


def test_a_slot_comes_back_whatever_way_a_job_leaves_the_queue(
    dep: Deployment, r: redis.Redis
) -> None:
    carol = _owner(dep, r, max_queued=50)
    ran = [_sleep(carol, "sleep").json()["id"] for _ in range(3)]  # started by the worker
    expired = _sleep(carol, max_queue_s=0.3).json()["id"]  # no worker: the reaper ends it
    canceled = _sleep(carol).json()["id"]
    carol.http.post(f"/v1/jobs/{canceled}/cancel")
    # A worker SIGKILLed mid-job: the reaper queues the job again (a slot taken again),
    # a new worker runs it (given back).
    long = carol.http.post(
        "/v1/jobs", json={"kind": "sleep", "input": {"model": "sleep", "steps": 20, "step_ms": 100}}
    ).json()["id"]
    wait_until(lambda: carol.get(long)["status"] == "running", timeout_s=20)
    (worker,) = [p for p in dep.procs if p.name.startswith("worker-sleep")]
    worker.kill()
    dep.procs.remove(worker)
    wait_until(lambda: carol.get(long)["attempts"] == 1 and carol.get(long)["status"] == "queued")
    assert _quota(carol)["queued"] == 1
    dep.start_worker("sleep")
    for job_id in [*ran, long]:
        assert carol.wait(job_id)["status"] == "succeeded"
    assert carol.wait(expired)["status"] == "expired"
    assert _quota(carol)["queued"] == 0
    assert _quota(carol)["running"] == 0  # released slots too: none leaked by the kill


def test_jobs_running_at_once_are_capped_per_key_and_others_run_beside(
    dep: Deployment, r: redis.Redis
) -> None:
    """Four echo slots: a key capped at one runs its jobs one after another, while another
    key's job takes a free slot at once."""
    gus, hal = _owner(dep, r, max_running=1), _owner(dep, r)
    assert _quota(gus)["max_running"] == 1
    capped = [gus.submit("echo", text=f"g{i}", sleep_ms=300, group=f"g{i}")["id"] for i in range(3)]
    other = hal.submit("echo", text="h", sleep_ms=300, group="h")["id"]
    wait_until(lambda: gus.get(capped[0])["status"] == "running", timeout_s=20)
    assert _quota(gus)["running"] == 1
    runs = sorted((j["started_at"], j["finished_at"]) for j in map(gus.wait, capped))
    assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(runs)), runs
    beside = hal.wait(other)
    assert beside["status"] == "succeeded"
    assert beside["started_at"] < runs[-1][0]  # not behind the capped key's jobs
    assert _quota(gus)["running"] == 0 and _quota(hal)["running"] == 0


def _chat(api: Api, max_tokens: int) -> httpx.Response:
    inp = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens}
    return api.http.post("/v1/jobs", json={"kind": "llm", "input": inp})


def test_a_token_quota_counts_max_tokens_with_openais_headers(
    dep: Deployment, r: redis.Redis
) -> None:
    """As OpenAI's limiter counts a request when it is admitted: the prompt's estimated
    tokens ("Hello": 2) plus max_tokens."""
    ivy = _owner(dep, r, costs={"llm": 100})
    wait_until(lambda: time.time() % WINDOW_S < WINDOW_S / 2)  # a fresh window for the run
    first = _chat(ivy, 40)
    assert first.status_code == 202, first.text
    assert first.headers["x-ratelimit-limit-tokens"] == "100"
    assert first.headers["x-ratelimit-remaining-tokens"] == "58"
    assert first.headers["x-ratelimit-reset-tokens"].endswith("s")
    assert "x-ratelimit-limit-requests" not in first.headers  # no requests quota
    assert _chat(ivy, 40).headers["x-ratelimit-remaining-tokens"] == "16"
    refused = _chat(ivy, 40)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "quota_exceeded"
    assert "llm tokens: 84 of 100" in error["message"] and "this request: 42" in error["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
    assert refused.headers["x-ratelimit-remaining-tokens"] == "16"
    assert _quota(ivy)["costs"]["llm"] == {"unit": "tokens", "limit": 100, "used": 84}
    too_big = _chat(ivy, 500)
    assert too_big.status_code == 429 and "the request alone costs 502" in too_big.text
    time.sleep(int(refused.headers["retry-after"]))
    assert _chat(ivy, 40).status_code == 202  # a new window
    other = _owner(dep, r)  # no token quota: no tokens headers
    assert "x-ratelimit-limit-tokens" not in _chat(other, 40).headers
    # A cost quota on another kind leaves this one free.
    jay = _owner(dep, r, costs={"image": 1})
    assert _chat(jay, 40).status_code == 202
    # Embeddings count tokens too: "hello world" is 3.
    kit = _owner(dep, r, costs={"embed": 50})
    sent = kit.http.post("/v1/jobs", json={"kind": "embed", "input": {"input": "hello world"}})
    assert sent.status_code == 202, sent.text
    assert sent.headers["x-ratelimit-limit-tokens"] == "50"
    assert sent.headers["x-ratelimit-remaining-tokens"] == "47"


def test_audio_seconds_count_when_an_asr_job_ends(kinds_dep: Deployment) -> None:
    """An ASR job's cost (its audio's seconds) is known once it is decoded: the worker's
    end counts it, in the window the job ends in."""
    r = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    kim = limited_owner(kinds_dep.redis_url, kinds_dep.base_url, costs={"asr": 600})
    upload = kim.http.post("/v1/files", files={"file": ("quiet.wav", silence(2.5), "audio/wav")})
    assert upload.status_code == 201, upload.text
    job = kim.wait(kim.submit("asr", audio=upload.json()["key"])["id"], timeout_s=120)
    assert job["status"] == "succeeded" and job["output"]["duration"] == 2.5
    owner = kim.http.get("/v1/whoami").json()["owner"]
    ended = datetime.fromisoformat(job["finished_at"]).timestamp()
    window = int(ended // 2)  # kinds_dep's quota window: 2 s
    spent = [r.get(keys.cost_in(owner, "asr", w)) for w in (window - 1, window, window + 1)]
    assert sum(int(s or 0) for s in spent) == 3, spent  # 2.5 s, rounded up


def test_cost_limits_must_name_a_kind_with_a_cost(dep: Deployment, r: redis.Redis) -> None:
    admin = Api(dep.base_url, create_key(r, f"adm{time.monotonic_ns()}", admin=True))
    name = _owner(dep, r).http.get("/v1/whoami").json()["owner"]
    bad = admin.http.put(f"/v1/admin/limits/{name}", json={"costs": {"sleep": 5}})
    assert bad.status_code == 422 and "'sleep' has no cost quota" in bad.text
    put = admin.http.put(f"/v1/admin/limits/{name}", json={"costs": {"tts": 500}})
    assert put.status_code == 200
    assert put.json()["costs"]["tts"] == {"unit": "characters", "limit": 500, "used": 0}


def test_requests_per_window_with_openais_headers(dep: Deployment, r: redis.Redis) -> None:
    dave = _owner(dep, r, requests=3)
    wait_until(lambda: time.time() % WINDOW_S < WINDOW_S / 2)  # a fresh window for the run
    remaining = []
    for _ in range(3):
        answer = _sleep(dave)
        assert answer.status_code == 202
        assert answer.headers["x-ratelimit-limit-requests"] == "3"
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(answer.headers["x-ratelimit-remaining-requests"])
    assert remaining == ["2", "1", "0"]
    refused = _sleep(dave)
    assert refused.status_code == 429
    assert "requests: 3 of 3" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    listed = dave.http.get("/v1/jobs")
    assert listed.headers["x-ratelimit-remaining-requests"] == "0"
    time.sleep(int(refused.headers["retry-after"]))
    assert _sleep(dave).status_code == 202
    assert "x-ratelimit-limit-requests" not in _owner(dep, r).http.get("/v1/jobs").headers


def test_an_admin_sets_limits_and_a_key_sees_its_own(dep: Deployment, r: redis.Redis) -> None:
    admin = Api(dep.base_url, create_key(r, f"adm{time.monotonic_ns()}", admin=True))
    erin = _owner(dep, r)
    name = erin.http.get("/v1/whoami").json()["owner"]
    assert _quota(erin)["max_queued"] == 0  # the deployment's default: none
    put = admin.http.put(f"/v1/admin/limits/{name}", json={"max_queued": 2, "requests": 9})
    assert put.status_code == 200 and put.json()["max_queued"] == 2
    assert _quota(erin) | {"queued": 0} == put.json() | {"queued": 0}
    assert erin.http.put(f"/v1/admin/limits/{name}", json={"max_queued": 99}).status_code == 403
    assert admin.http.put(f"/v1/admin/limits/{name}", json={"max_queued": -1}).status_code == 422
    cleared = admin.http.put(f"/v1/admin/limits/{name}", json={})
    assert cleared.json()["max_queued"] == 0 and cleared.json()["requests"] == 0


def test_the_official_client_retries_on_429(kinds_dep: Deployment) -> None:
    """kinds_dep's window is 2 s (conftest): the client waits for Retry-After and gets it."""
    r = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    name = f"rt{time.monotonic_ns()}"
    set_limits(r, name, KeyLimits(requests=1))
    key = create_key(r, name)
    statuses: list[int] = []
    seen = httpx.Client(event_hooks={"response": [lambda r: statuses.append(r.status_code)]})
    client = openai.OpenAI(base_url=f"{kinds_dep.base_url}/v1", api_key=key, http_client=seen)
    speech = {"model": "tts", "voice": "joe", "input": "Hi.", "response_format": "wav"}
    wait_until(lambda: time.time() % 2 < 1)
    assert client.audio.speech.create(**speech).read()  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError):
        client.with_options(max_retries=0).audio.speech.create(**speech)  # type: ignore[arg-type]
    statuses.clear()
    assert client.with_options(max_retries=3).audio.speech.create(**speech).read()  # type: ignore[arg-type]
    assert statuses[0] == 429 and statuses[-1] == 200, statuses  # refused, waited, retried


def test_the_counts_survive_a_redis_crash_at_fsync(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", fsync_always=True).start()
    try:
        (tmp_path / "deploy").mkdir()
        env = {"MMQ_REDIS__DURABILITY": "fsync"}
        deployment = Deployment(server.url, tmp_path / "deploy", env)
        with deployment.config_path.open("a") as config:
            config.write(IDLE)
        with serving(deployment):
            deployment.start_api()
            r = redis.Redis.from_url(server.url, decode_responses=True)
            frank = _owner(deployment, r, max_queued=6)
            ids = [_sleep(frank).json()["id"] for _ in range(4)]
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
            server.start()
            wait_until(lambda: _whoami_ok(frank), timeout_s=30)
            assert _quota(frank)["queued"] == 4
            assert [_sleep(frank).status_code for _ in range(3)] == [202, 202, 429]
            for job_id in ids:
                frank.http.post(f"/v1/jobs/{job_id}/cancel")
            assert _quota(frank)["queued"] == 2
    finally:
        server.stop()


def _whoami_ok(api: Api) -> bool:
    try:
        return api.http.get("/v1/whoami").status_code == 200
    except httpx.HTTPError:
        return False


def test_metrics_and_the_overview_show_each_keys_usage(dep: Deployment, r: redis.Redis) -> None:
    gina = _owner(dep, r, max_queued=7)
    name = gina.http.get("/v1/whoami").json()["owner"]
    assert _sleep(gina).status_code == 202
    admin = Api(dep.base_url, create_key(r, f"adm{time.monotonic_ns()}", admin=True))
    metrics = admin.http.get("/metrics").text
    assert f'mmq_key_jobs_queued{{owner="{name}"}} 1.0' in metrics
    assert f'mmq_key_limit{{owner="{name}",quota="max_queued"}} 7.0' in metrics
    # Without a key (api.metrics_without_key = "anonymous"), or with one that is not an
    # admin's, no series names an owner; the rest is there.
    for anonymous in (httpx.get(f"{dep.base_url}/metrics").text, gina.http.get("/metrics").text):
        assert not [line for line in anonymous.splitlines() if line.startswith("mmq_key_")]
        assert f'"{name}"' not in anonymous
        assert "mmq_jobs_queued" in anonymous
    shown = {k["owner"]: k for k in admin.http.get("/v1/admin/overview").json()["keys"]}
    assert shown[name]["queued"] == 1 and shown[name]["max_queued"] == 7
