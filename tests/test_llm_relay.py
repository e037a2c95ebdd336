"""The LLM token path at scale, against a real engine process that costs nothing per
token (`bench.synthetic_engine`: one token per running sequence per step, like vLLM's
continuous batching): several API processes (`api.workers`) and several worker processes
feeding one engine, every stream whole and in order; a canceled job's sequence aborted in
the engine; every status change and the job's record as with any engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psutil
import pytest
import redis

from common.procs import free_port
from common.sse import SseParser
from harness.api_client import Api, new_owner
from harness.kinds import llm_toml
from tuning.deployment import (
    Deployment,
    Proc,
    flush,
    running_on,
    serving,
    status_events,
    wait_until,
)
from workers.shutdown import HAND_BACK_WAIT_S, STRAGGLER_WAIT_S

STEP_MS = 10
TOKEN = " tok"
API_GRACE_S = 2
"""`api.shutdown_grace_s` here: short beside the streams that outlive it."""


@dataclass
class Relay:
    dep: Deployment
    engine_url: str
    api: Proc
    workers: list[Proc]


@pytest.fixture(scope="module")
def relay(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    flush(redis_url)
    port = free_port()
    env = {
        "MMQ_API__WORKERS": "2", "MMQ_LEASE__TTL_S": "3", "MMQ_LEASE__HEARTBEAT_S": "0.5",
        "MMQ_API__SHUTDOWN_GRACE_S": str(API_GRACE_S),
    }  # fmt: skip
    dep = Deployment(redis_url, tmp_path_factory.mktemp("relay"), env_overrides=env)
    dep.config_path.write_text(
        dep.config_path.read_text()
        + llm_toml(
            "relay",
            "synthetic",
            {"engine": "url", "engine_url": f"http://127.0.0.1:{port}", "max_inflight": 32},
        )
        # Served only by the workers that the shutdown test starts and stops.
        + llm_toml(
            "relay_stop",
            "synthetic",
            {"engine": "url", "engine_url": f"http://127.0.0.1:{port}", "max_inflight": 16},
        )
    )
    with serving(dep):
        engine = dep.launch(
            "engine",
            [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port),
             "--step-ms", str(STEP_MS)],
        )  # fmt: skip
        engine_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{engine_url}/health"), engine, timeout_s=30)
        workers = dep.start(["relay", "relay"])  # instances 0 and 1, with the API and all
        (api,) = [proc for proc in dep.procs if proc.name == "api"]
        yield Relay(dep, engine_url, api, workers)


@pytest.fixture
def api(relay: Relay) -> Api:
    return new_owner(relay.dep.redis_url, relay.dep.base_url, f"relay{time.monotonic_ns()}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _stats(relay: Relay) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(f"{relay.engine_url}/stats", timeout=5).json()
    return stats


@dataclass
class Streamed:
    text: str
    deltas: int
    """Chunks that carried text."""
    finish: str | None
    completion_tokens: int
    job_id: str


async def _stream(http: httpx.AsyncClient, tokens: int, model: str = "relay") -> Streamed:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    pieces: list[str] = []
    finish, used = None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        job_id = response.headers["X-Job-Id"]
        parser = SseParser()
        async for data in response.aiter_bytes():
            for message in parser.feed_bytes(data):
                if message.data == "[DONE]":
                    continue
                chunk = json.loads(message.data)
                for choice in chunk["choices"]:
                    pieces.append(choice["delta"].get("content") or "")
                    finish = choice["finish_reason"] or finish
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
    return Streamed("".join(pieces), sum(map(bool, pieces)), finish, used, job_id)


def _api_children_with_streams(api: Proc, port: int) -> set[int]:
    """The API's processes that hold a client connection on its port now."""
    holding = set()
    for child in psutil.Process(api.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            conns = child.net_connections(kind="tcp")
            if any(c.status == "ESTABLISHED" and c.laddr.port == port for c in conns):
                holding.add(child.pid)
    return holding


def test_every_stream_is_whole_through_two_api_processes_and_two_relays(
    relay: Relay, api: Api
) -> None:
    streams, tokens = 48, 100  # more streams than one worker's max_inflight (32), 1 s each
    headers = {"Authorization": api.http.headers["Authorization"]}

    async def wave(count: int, holding: set[int]) -> list[Streamed]:
        """`count` streams on connections of their own, and which API processes held one
        of them, looked at while they run (1 s or more each)."""
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(
            base_url=relay.dep.base_url, headers=headers, timeout=60, limits=limits
        ) as http:
            running = [asyncio.create_task(_stream(http, tokens)) for _ in range(count)]
            while not all(task.done() for task in running):
                holding |= _api_children_with_streams(relay.api, relay.dep.api_port)
                await asyncio.sleep(0.05)
            return list(await asyncio.gather(*running))

    async def main() -> tuple[list[Streamed], int]:
        # Whichever API process is awake accepts a connection, so on a busy host one may
        # accept a whole burst: more waves on new connections, until both have served
        # streams (a few at most).
        holding: set[int] = set()
        done = await wave(streams, holding)
        for _ in range(5):
            if len(holding) == 2:
                break
            done += await wave(8, holding)
        return done, len(holding)

    done, holding = asyncio.run(main())
    assert holding == 2  # both API processes serve streams
    for streamed in done:
        assert streamed.text == TOKEN * tokens
        assert streamed.deltas > 1  # in pieces as they come (a step apart)
        assert streamed.finish == "length" and streamed.completion_tokens == tokens
    workers = {api.get(s.job_id)["worker"] for s in done}
    assert len(workers) == 2  # 48 streams, 32 at most on one worker: both relays fed it
    # Fair share (on by default) counts an LLM worker's slots as its engine's max_inflight,
    # not the thread setting's 4: more sequences ran at once than one relay takes.
    assert _stats(relay)["peak"] > 32
    jobs = [api.get(s.job_id) for s in done[:3]]
    for job in jobs:
        assert job["status"] == "succeeded" and job["output"]["text"] == TOKEN * tokens
        assert job["timings"]["ttft_ms"] > 0 and job["timings"]["tpot_ms"] > 0


def test_a_canceled_stream_aborts_its_sequence_in_the_engine(relay: Relay, api: Api) -> None:
    before = _stats(relay)
    job = api.submit("llm", model="relay", prompt="Count.", max_tokens=4000)  # 40 s at 10 ms a step
    wait_until(lambda: api.get(job["id"]).get("status") == "running", timeout_s=30)
    wait_until(lambda: _stats(relay)["running"] >= 1, timeout_s=30)
    assert api.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    assert api.wait(job["id"])["status"] == "canceled"
    wait_until(lambda: _stats(relay)["aborted"] > before["aborted"], timeout_s=30)
    assert _stats(relay)["running"] == 0


def test_a_sigtermed_relay_finishes_short_streams_and_hands_back_long_ones(
    relay: Relay, api: Api
) -> None:
    """SIGTERM to a relay worker with streams in flight: those that end within the grace end
    there (attempts 1); the rest are aborted in the engine and handed back, run again on
    another worker (attempts 1, not 2), and each client's stream still reads its whole text
    once. The worker exits 0 and takes no job after the signal."""
    dep = relay.dep
    r = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    grace_s = 5.0
    victim = dep.start_worker("relay_stop", 0, env={"MMQ_WORKER__SHUTDOWN_GRACE_S": str(grace_s)})
    short, long = 300, 1000  # 3 s and 10 s at 10 ms a step
    sizes = [short] * 4 + [long] * 4
    streamed: list[Streamed] = []

    async def clients() -> None:
        async with httpx.AsyncClient(
            base_url=dep.base_url, headers=api.http.headers, timeout=120
        ) as http:
            streamed.extend(await asyncio.gather(*(_stream(http, n, "relay_stop") for n in sizes)))

    readers = threading.Thread(target=asyncio.run, args=(clients(),))
    readers.start()
    before = _stats(relay)
    wait_until(lambda: len(running_on(r, victim)) == len(sizes), victim, timeout_s=30)
    held = running_on(r, victim)
    os.kill(victim.process.pid, signal.SIGTERM)
    late = api.submit("llm", model="relay_stop", prompt="Late.", max_tokens=5)["id"]
    victim.process.wait(grace_s + HAND_BACK_WAIT_S + STRAGGLER_WAIT_S + 20)
    assert victim.process.returncode == 0, victim.log()[-3000:]
    # The engine counts an abort when it reads the closed request, which on a busy host may
    # come a moment after the worker's exit.
    wait_until(lambda: _stats(relay)["aborted"] - before["aborted"] >= 4, timeout_s=10)
    assert _stats(relay)["aborted"] - before["aborted"] == 4
    handed = {j for j in held if api.get(j)["status"] == "queued"}
    assert len(handed) == 4 and all(api.get(j)["attempts"] == 0 for j in handed)
    assert api.get(late)["status"] == "queued" and status_events(r, late) == ["queued"]

    other = dep.start_worker("relay_stop", 1)
    readers.join(120)
    assert sorted(len(s.text) for s in streamed) == sorted(len(TOKEN) * n for n in sizes)
    for s in streamed:
        assert s.text == TOKEN * len(s.text.split()) and s.finish == "length"
        job = api.wait(s.job_id)
        assert job["status"] == "succeeded" and job["attempts"] == 1, job
        statuses = status_events(r, s.job_id)
        if s.job_id in handed:
            assert len(s.text) == len(TOKEN) * long
            assert statuses == ["queued", "running", "queued", "running", "succeeded"]
        else:
            assert statuses == ["queued", "running", "succeeded"]
    assert api.wait(late)["status"] == "succeeded"
    other.stop()


def test_a_stopped_api_cancels_the_completion_it_streamed_but_not_a_job_of_v1_jobs(
    relay: Relay, api: Api
) -> None:
    """SIGTERM to the API (its two processes) while it streams a completion and a job of
    `/v1/jobs` runs: the stream ends within the shutdown grace, and its job is canceled, as
    when its client goes away, instead of running again for nobody; the other job runs on,
    and a new API process reads it once it has ended. (Last here: it stops the API.)"""
    dep = relay.dep
    seen: dict[str, str] = {}
    got_text = threading.Event()

    def reader() -> None:
        body = {"model": "relay", "messages": [{"role": "user", "content": "Count."}],
                "max_tokens": 4000, "stream": True}  # fmt: skip  # 40 s at 10 ms a step
        with contextlib.suppress(httpx.HTTPError), httpx.stream(
            "POST", f"{dep.base_url}/v1/chat/completions", json=body,
            headers=api.http.headers, timeout=60,
        ) as response:  # fmt: skip
            seen["job"] = response.headers["X-Job-Id"]
            for _ in response.iter_bytes():
                got_text.set()

    streaming = threading.Thread(target=reader)
    streaming.start()
    polled = api.submit("llm", model="relay", prompt="Count.", max_tokens=1500)["id"]  # 15 s
    assert got_text.wait(30)
    wait_until(lambda: api.get(polled)["status"] == "running", timeout_s=30)
    os.kill(relay.api.process.pid, signal.SIGTERM)
    relay.api.process.wait(API_GRACE_S + 30)
    streaming.join(30)
    assert not streaming.is_alive()  # the stream ended with the API, not with its 40 s
    dep.procs.remove(relay.api)
    dep.start_api()
    streamed = api.wait(seen["job"], timeout_s=60)
    assert (streamed["status"], streamed["attempts"]) == ("canceled", 1), streamed
    finished = api.wait(polled, timeout_s=120)
    assert (finished["status"], finished["attempts"]) == ("succeeded", 1), finished
