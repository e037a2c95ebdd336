"""An on-demand LLM pipeline on vLLM's sleep mode, against a real engine process that takes
`vllm serve`'s command line and serves vLLM's sleep routes (`bench.synthetic_engine`: vLLM
itself needs a GPU): an idle unload puts the engine to sleep instead of stopping it and
gives the device's room back, the worker stays (though `exit_after_unload` is on), and the
next job wakes the same engine process instead of starting another."""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from common.procs import free_port
from harness.api_client import Api, new_owner
from harness.kinds import llm_toml
from harness.scrape import scrape, value
from jobs import keys
from tuning.deployment import REPO, Deployment, flush, running, wait_until

IDLE_UNLOAD_S = 1.0
ENV = {
    "MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 1.0}),
    "MMQ_LEASE__TTL_S": "2",
    "MMQ_LEASE__HEARTBEAT_S": "0.4",
}


@dataclass
class Sleepy:
    dep: Deployment
    engine_url: str


@pytest.fixture(scope="module")
def sleepy(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sleepy]:
    flush(redis_url)
    tmp = tmp_path_factory.mktemp("sleep")
    vllm = tmp / "vllm"  # what `engine_bin` names: vLLM's executable in its own environment
    engine = f"{shlex.quote(sys.executable)} -m bench.synthetic_engine"
    vllm.write_text(f'#!/bin/sh\ncd {shlex.quote(str(REPO))} && exec {engine} "$@"\n')
    vllm.chmod(0o755)
    port = free_port()
    options = {
        "engine": "vllm", "engine_bin": str(vllm), "port": port, "sleep_mode": True,
        "max_inflight": 8, "startup_timeout_s": 60,
    }  # fmt: skip
    config = llm_toml(
        "napper",
        "synthetic",
        options,
        residency="on_demand",
        memory_gb=0.5,
        min_loaded_s=0,
        idle_unload_s=IDLE_UNLOAD_S,
        exit_after_unload=True,
    )
    with running(redis_url, tmp, ENV, ["napper"], config) as dep:
        yield Sleepy(dep, f"http://127.0.0.1:{port}")


@pytest.fixture
def api(sleepy: Sleepy) -> Api:
    return new_owner(sleepy.dep.redis_url, sleepy.dep.base_url, f"nap{time.monotonic_ns()}")


def _chat(api: Api) -> dict[str, Any]:
    body = {"model": "napper", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    answer = api.http.post("/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    return api.get(answer.headers["X-Job-Id"])


def _engine(sleepy: Sleepy) -> dict[str, int]:
    stats: dict[str, int] = httpx.get(f"{sleepy.engine_url}/stats", timeout=5).json()
    return stats


def _unloads(sleepy: Sleepy) -> float:
    return value(scrape(sleepy.dep), "mmq_model_unloads_total", pipeline="napper", reason="idle")


def _counted(r: redis.Redis) -> list[str]:
    """The pipelines whose models count against a device's room now."""
    counted = []
    for device in r.smembers(keys.MODEL_DEVICES):
        host, _, name = str(device).partition("|")
        counted += [json.loads(v)["pipeline"] for v in r.hvals(keys.device_models(host, name))]
    return counted


def test_an_idle_engine_sleeps_and_the_next_job_wakes_the_same_process(
    sleepy: Sleepy, api: Api
) -> None:
    r = redis.Redis.from_url(sleepy.dep.redis_url, decode_responses=True)
    first = _chat(api)
    assert first["status"] == "succeeded" and first["timings"]["load_ms"] > 0
    worker_pid = r.hget(keys.worker(first["worker"]), "pid")
    engine = _engine(sleepy)
    assert engine["sleeps"] == 0 and _counted(r) == ["napper"]

    # Idle: asleep, not stopped; its room given back; the worker stays.
    wait_until(lambda: _engine(sleepy)["sleeps"] == 1, timeout_s=IDLE_UNLOAD_S * 20)
    asleep = httpx.get(f"{sleepy.engine_url}/is_sleeping", timeout=5).json()
    assert asleep == {"is_sleeping": True}
    wait_until(lambda: _counted(r) == [], timeout_s=10)
    wait_until(lambda: _unloads(sleepy) == 1, timeout_s=10)  # the tally: every second
    time.sleep(1.0)  # an exit after the unload would have happened by now
    assert r.hget(keys.worker(first["worker"]), "pid") == worker_pid

    # The next job wakes the same engine process: a load, but no second engine.
    again = _chat(api)
    assert again["status"] == "succeeded" and again["timings"]["load_ms"] > 0
    engine_now = _engine(sleepy)
    assert engine_now["pid"] == engine["pid"] and engine_now["wakes"] == 1
    assert again["worker"] == first["worker"]
    assert r.hget(keys.worker(again["worker"]), "pid") == worker_pid
    assert _counted(r) == ["napper"]
