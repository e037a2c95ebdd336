"""LLM engines that start or fail fast with the reason, with real processes: `transformers
serve` on the tiny random Llama, LLM workers, the API's /readyz, and `mmq workers`' console.

A config too large for any machine (a model claiming 2**32 tokens of context, and
`max_model_len` asking for all of it) fails before an engine starts; an engine that refuses
its KV cache (transformers' 503 "CB worker is dead") ends the wait at once instead of after
`startup_timeout_s` (900 s); `/readyz` names the pipeline and the reason. The shipped
`[pipelines.llm]` (max_inflight = 8, max_model_len = 2048, memory_gb = 3) starts on this
machine, on another model, and chats."""

from __future__ import annotations

import json
import re
import signal
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harness.api_client import new_owner
from harness.models.llm import cached_tiny_llm, tiny_llm_claiming
from jobs.schemas.llm_options import LlmOptions
from pipelines.llm.server import EngineServer, EngineSpec, EngineStartError
from pipelines.llm.sizing import GIB
from tuning.deployment import REPO, Deployment, Proc, flush, serving, wait_until

HUGE = 2**32
STARVED_ARGS = ["--cb-max-memory-percent", "0.00001"]
"""The engine then measures ~0 bytes available for its cache and kills its batching thread."""
PIPELINES = """
[pipelines.huge]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = {huge}

[pipelines.huge.options]
max_model_len = {max_len}

[pipelines.starved]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = {model}

[pipelines.starved.options]
extra_args = {starved_args}
"""


def shipped_llm(model: Path) -> str:
    """The repository's `[pipelines.llm]`, enabled on `model`, as TOML."""
    shipped = tomllib.loads((REPO / "mmq.toml").read_text())["pipelines"]["llm"]
    shipped.update(model=str(model), enabled=True)
    options = shipped.pop("options")
    assert (options["max_inflight"], options["max_model_len"], shipped["memory_gb"]) == (8, 2048, 3)
    lines = ["[pipelines.llm]", *_toml(shipped), "[pipelines.llm.options]", *_toml(options)]
    return "\n".join(lines) + "\n"


def _toml(table: dict[str, Any]) -> list[str]:
    return [f"{key} = {json.dumps(value)}" for key, value in table.items()]


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    model = cached_tiny_llm(tmp_path_factory)
    huge = tiny_llm_claiming(model, tmp_path_factory.mktemp("huge-llm"), HUGE)
    flush(redis_url)
    dep = Deployment(redis_url, tmp_path_factory.mktemp("llm-start"), {"HF_HUB_OFFLINE": "1"})
    extra = shipped_llm(model) + PIPELINES.format(
        huge=json.dumps(str(huge)), max_len=HUGE, model=json.dumps(str(model)),
        starved_args=json.dumps(STARVED_ARGS),
    )  # fmt: skip
    dep.config_path.write_text(dep.config_path.read_text() + extra)
    with serving(dep):
        dep.start_api()
        yield dep


def _readyz(dep: Deployment) -> tuple[int, list[str]]:
    r = httpx.get(f"{dep.base_url}/readyz", timeout=5)
    return r.status_code, list(r.json().get("missing", []))


GIVEN_UP_S = 150
"""An engine that refuses its cache is given up well within this (about 10 s on two idle
cores), where waiting for it would take `startup_timeout_s`, 900 s: a guard against that
wait, far above a busy machine's time, not a measure of speed."""


def _exit_after(proc: Proc, started: float, timeout_s: float = GIVEN_UP_S) -> float:
    wait_until(lambda: not proc.alive(), timeout_s=timeout_s)
    return time.monotonic() - started


def test_a_config_too_large_fails_at_once_and_readyz_says_why(dep: Deployment) -> None:
    started = time.monotonic()
    huge = dep.spawn("worker-huge", "worker", "--pipeline", "huge")
    starved = dep.spawn("worker-starved", "worker", "--pipeline", "starved")
    _exit_after(huge, started)
    starved_s = _exit_after(starved, started)
    assert huge.process.returncode == 1 and starved.process.returncode == 1
    # Sized before any engine starts: no engine was started for it (one was for starved).
    assert "engine starved: starting" in starved.log()
    assert "engine huge: starting" not in huge.log(), huge.log()
    assert starved_s < GIVEN_UP_S, starved.log()  # loads, refuses, and is given up at once

    status, missing = _readyz(dep)
    assert status == 503
    huge_line = next(m for m in missing if m.startswith("pipeline huge: "))
    assert huge_line.startswith(
        f"pipeline huge: the model does not fit: one sequence of {HUGE} tokens needs"
    )
    assert "lower options.max_model_len" in huge_line
    starved_line = next(m for m in missing if m.startswith("pipeline starved: "))
    assert re.match(
        r"pipeline starved: engine failed to start: CB worker is dead \(KV cache and buffers "
        r"of [\d.]+ GB > 0\.0 GB available\) \| engine log: \S+\.log$",
        starved_line,
    ), starved_line
    assert "worker for kind llm" not in missing
    for proc in (huge, starved):
        assert f"pipeline {proc.name[7:]} failed to start: " in proc.log()
        assert "Traceback" not in proc.log()  # the reason, not a wall


def test_mmq_workers_prints_why_a_worker_failed_to_start(dep: Deployment) -> None:
    placement = dep.tmp / "huge-placement.toml"
    placement.write_text('[[place]]\npipeline = "huge"\ndevice = "cpu"\n')
    launcher = dep.spawn(
        "workers-huge", "workers", "--placement", str(placement),
        env={"MMQ_STORAGE__LOCAL_SHARED": "true"},  # the API's disk: shared
    )  # fmt: skip
    wait_until(lambda: "exited with 1; restarting in" in launcher.log(), launcher, 60)
    launcher.process.send_signal(signal.SIGINT)
    assert launcher.process.wait(30) == 0
    lines = launcher.log().splitlines()
    why = [line for line in lines if "worker huge#0 on cpu: pipeline huge failed to start" in line]
    assert why and "the model does not fit: one sequence of" in why[0], launcher.log()
    assert len(why[0]) < 600


def test_the_shipped_defaults_start_on_this_machine_and_answer_a_chat(dep: Deployment) -> None:
    tests = [dep.start_worker("echo", wait=False), dep.start_worker("sleep", wait=False)]
    worker = dep.spawn("worker-llm", "worker", "--pipeline", "llm")  # all three at once
    seen: list[str] = []

    def ready() -> bool:
        seen.extend(_readyz(dep)[1])
        return "ready." in worker.log()

    wait_until(ready, worker, timeout_s=240)
    assert any(m.startswith("pipeline llm: loading on llm-0@") for m in seen), seen
    sized = next(line for line in worker.log().splitlines() if "engine llm sized:" in line)
    assert "8 sequences x 2048 tokens = 512 blocks of 32" in sized and "batch 512" in sized
    assert "memory_gb 3 of MemAvailable" in sized and "KV 1024 B/token" in sized
    dep.wait_started(tests)
    wait_until(lambda: _readyz(dep)[0] == 200, timeout_s=20)

    owner = new_owner(dep.redis_url, dep.base_url, f"shipped{time.monotonic_ns()}")
    oai = openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=owner.key, max_retries=0)
    answer = oai.chat.completions.create(
        model="llm", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert answer.choices[0].message.content and answer.usage is not None
    assert answer.usage.completion_tokens == 8
    # OpenAI's chat model names mean the shipped LLM, and the model list says so.
    listed = {m.id: m for m in oai.models.list()}
    assert listed["gpt-4o-mini"].model_dump()["pipeline"] == "llm"
    named = oai.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
        temperature=0,
    )  # fmt: skip
    assert named.choices[0].message.content == answer.choices[0].message.content


def test_an_engine_that_refuses_its_cache_is_given_up_at_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """And the sizing's estimate of what `transformers serve` allocates covers the engine's
    own figure (the guard of the sizing's model of transformers 5.23)."""
    model = cached_tiny_llm(tmp_path_factory)
    options = LlmOptions(extra_args=STARVED_ARGS)  # startup_timeout_s stays 900
    server = EngineServer(EngineSpec("starved", str(model), "cpu", options, tmp_path))
    started = time.monotonic()
    with pytest.raises(
        EngineStartError, match=r"^engine failed to start: CB worker is dead"
    ) as info:
        server.start()
    assert time.monotonic() - started < GIVEN_UP_S and not server.alive()
    footprint = re.search(r"Memory footprint (\d+) is more", info.value.tail)
    assert footprint is not None, info.value.tail
    assert server.size is not None
    assert int(footprint[1]) <= server.size.engine_bytes <= 1.25 * int(footprint[1])


def test_an_engine_capped_by_memory_gb_runs_fewer_sequences_and_answers(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = cached_tiny_llm(tmp_path_factory)
    spec = EngineSpec("capped", str(model), "cpu", LlmOptions(), tmp_path, int(1.3 * GIB))
    server = EngineServer(spec)
    try:
        server.start()  # returns once the engine answered a generation
        assert server.size is not None
        assert (server.size.sequences, server.size.context) == (27, 2048)
        assert "sequences cut to 27 (from 48)" in server.size.describe()
    finally:
        server.stop()


def test_a_machine_without_vllm_is_told_what_to_install_or_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No CPU environment, no `vllm` on the PATH: the start fails with what to do (the
    worker records it for /readyz and `mmq up`), before any process starts; a GPU device
    is never served by the CPU build."""
    from pipelines.llm import command

    monkeypatch.setenv("PATH", str(tmp_path))  # no `vllm` of the machine's
    options = LlmOptions(engine="vllm")
    gpu = EngineServer(EngineSpec("big", "some/model", "gpu:0", options, tmp_path))
    with pytest.raises(EngineStartError, match=r"^vLLM is not installed here for gpu:0: set "):
        gpu.start()
    assert gpu.process is None

    monkeypatch.setattr(command, "VLLM_CPU_ENV", tmp_path / "no-such-env")
    cpu = EngineServer(EngineSpec("small", "some/model", "cpu", options, tmp_path))
    with pytest.raises(EngineStartError) as info:
        cpu.start()
    assert "`make install` builds its CPU environment in" in info.value.summary
    assert "options.engine_bin" in info.value.summary and cpu.process is None
