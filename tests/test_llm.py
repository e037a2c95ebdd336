"""LLM jobs end to end, on each engine mmq starts: the API under uvicorn, LLM worker
processes that each run a real engine server on a tiny random Llama from disk (`transformers
serve`, and the real vLLM: its CPU build, from the environment `make install` builds), real
Redis; jobs, the OpenAI-compatible routes, routing, admission, cache, restarts. The engine is
the module's parameter: every test runs on both, each engine started once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import openai
import pytest

from common.sse import parse_lines
from harness.api_client import Api, new_owner
from harness.kinds import VLLM_TEST_ENV, VLLM_TEST_OPTIONS, llm_toml
from harness.models.llm import cached_tiny_llm, tiny_llm_claiming
from harness.scrape import JOB_HISTOGRAMS, check_job_counted, scrape, value
from jobs.schemas.llm_options import LlmOptions
from pipelines.llm.server import EngineServer, EngineSpec, EngineStartError
from tuning.deployment import Deployment, Proc, flush, live_in_group, serving, wait_until

LONG_THRESHOLD = 60
MAX_QUEUED = 10
LONG_CONTEXT = 32768
LONG = 30000
"""A job that runs until it is stopped: 30,000 tokens take vLLM 20 s here."""
ON_DEMAND = {"residency": "on_demand", "idle_unload_s": 3, "min_loaded_s": 0, "memory_gb": 2}
"""`llm-od`: its engine starts for a job and stops once idle."""
BEFORE_THE_ENGINE = (
    "mmq decides it before any engine sees the job (validation, the cache per owner, "
    "priorities and the queue's 429): checked once, on the default engine"
)
ENGINES: dict[str, dict[str, Any]] = {
    "transformers": {"engine": "transformers"},
    "vllm": VLLM_TEST_OPTIONS,
}


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def llm_dep(
    engine: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    # The tiny model with room for sequences that run long enough, on vLLM too, to be
    # canceled, cut off or killed mid-stream (tokens come every ~0.6 ms there).
    model = str(tiny_llm_claiming(cached_tiny_llm(tmp_path_factory),
                                  tmp_path_factory.mktemp("long-llm"), LONG_CONTEXT))  # fmt: skip
    flush(redis_url)
    # Leases of 10 s (the default): vLLM and mmq share two cores here, and a busy engine
    # has held up every other process for seconds at a time.
    env = {"HF_HUB_OFFLINE": "1", "MMQ_LEASE__TTL_S": "10", "MMQ_LEASE__HEARTBEAT_S": "1"}
    env |= {"MMQ_QUEUE__MAX_QUEUED": str(MAX_QUEUED), "MMQ_LIMITS__LLM_MAX_TOKENS": str(LONG)}
    env |= VLLM_TEST_ENV
    dep = Deployment(redis_url, tmp_path_factory.mktemp(f"llm-{engine}"), env_overrides=env)
    common = ENGINES[engine] | {"startup_timeout_s": 240}
    short = common | {
        "max_inflight": 3, "long_prompt_threshold": LONG_THRESHOLD, "long_pipeline": "llm-long"
    }  # fmt: skip
    extra = llm_toml("llm", model, short, aliases=["tiny-chat"])
    extra += llm_toml("llm-long", model, common | {"max_inflight": 1})
    extra += llm_toml("llm-od", model, common | {"max_inflight": 2}, **ON_DEMAND)
    dep.config_path.write_text(dep.config_path.read_text() + extra)
    with serving(dep):
        workers = [
            dep.spawn(f"worker-{n}", "worker", "--pipeline", n)
            for n in ("llm", "llm-long", "llm-od")
        ]
        dep.start()  # the API, the reaper and the scheduler while the engines start
        dep.wait_started(workers, timeout_s=300)
        yield dep


@pytest.fixture
def api(llm_dep: Deployment) -> Api:
    return new_owner(llm_dep.redis_url, llm_dep.base_url, f"llm{time.monotonic_ns()}")


def _chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0, **extra}


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def _wait_for_a_token(api: Api, job_id: str) -> None:
    with api.http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=120) as response:
        next(m for m in parse_lines(response.iter_lines()) if m.event == "partial")


def _events(api: Api, job_id: str) -> list[dict[str, Any]]:
    with api.http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=120) as response:
        return [json.loads(m.data) for m in parse_lines(response.iter_lines())]


def test_tokens_stream_as_partial_events_and_timings_are_recorded(api: Api) -> None:
    job = api.submit("llm", **_chat("Hello there", max_tokens=12, cache=False))
    events = _events(api, job["id"])
    partials = [e["data"] for e in events if e["type"] == "partial"]
    output = next(e["data"] for e in events if e["type"] == "output")
    assert events[-1]["data"]["status"] == "succeeded"
    # Each partial is a delta that starts at token `index`; tokens that waited for a write
    # go out as one delta (workers/event_writer.py), so indices rise from 0, with gaps then.
    indices = [p["index"] for p in partials]
    assert indices[0] == 0 and indices == sorted(set(indices)), indices
    assert "".join(p["text"] for p in partials) == output["text"]
    assert output["usage"]["completion_tokens"] == 12 and output["finish_reason"] == "length"
    assert output["usage"]["prompt_tokens"] > 0 and output["cached"] is False

    timings = api.get(job["id"])["timings"]
    ttft, e2e, tpot = timings["ttft_ms"], timings["e2e_ms"], timings["tpot_ms"]
    assert 0 < ttft <= e2e and timings["itl_ms"] > 0
    assert tpot == pytest.approx((e2e - ttft) / 11, rel=1e-3, abs=1e-3)
    assert timings["time_to_first_output_ms"] <= timings["total_ms"]


def test_temperature_zero_answers_are_deterministic_and_cached(api: Api) -> None:
    first = api.wait(api.submit("llm", **_chat("Cache me", max_tokens=8))["id"], 120)
    r = api.http.post("/v1/jobs", json={"kind": "llm", "input": _chat("Cache me", max_tokens=8)})
    assert r.status_code == 200, r.text  # answered at once: the job has already ended
    again = r.json()
    assert first["output"]["cached"] is False
    assert again["status"] == "succeeded" and again["output"]["cached"] is True
    assert again["output"]["text"] == first["output"]["text"]
    assert again["attempts"] == 1 and again["timings"]["queue_wait_ms"] < 1000

    fresh = api.wait(api.submit("llm", **_chat("Cache me", max_tokens=8, cache=False))["id"], 120)
    assert fresh["output"]["cached"] is False and fresh["output"]["text"] == first["output"]["text"]
    other = api.wait(api.submit("llm", **_chat("Cache me", max_tokens=9))["id"], 120)
    assert other["output"]["cached"] is False  # other parameters, another answer
    sampled = _chat("Cache me", max_tokens=8, temperature=0.8, seed=1)
    api.wait(api.submit("llm", **sampled)["id"], 120)
    assert api.wait(api.submit("llm", **sampled)["id"], 120)["output"]["cached"] is False
    assert "ttft_ms" not in again["output"] and again["timings"]["ttft_ms"] is None


@pytest.mark.engines("transformers", why=BEFORE_THE_ENGINE)
def test_the_cache_is_per_owner(llm_dep: Deployment, api: Api) -> None:
    api.wait(api.submit("llm", **_chat("Mine alone", max_tokens=4))["id"], 120)
    assert api.http.post(
        "/v1/jobs", json={"kind": "llm", "input": _chat("Mine alone", max_tokens=4)}
    ).json()["output"]["cached"]
    other = new_owner(llm_dep.redis_url, llm_dep.base_url, f"other{time.monotonic_ns()}")
    job = other.wait(other.submit("llm", **_chat("Mine alone", max_tokens=4))["id"], 120)
    assert job["output"]["cached"] is False


def test_long_prompts_run_on_their_own_engine_and_short_ones_never_wait(api: Api) -> None:
    long_text = "The quick brown fox jumps over the lazy dog. " * 30
    longs = [
        api.submit("llm", **_chat(long_text + str(i), max_tokens=LONG, cache=False))
        for i in range(2)
    ]
    short = api.submit("llm", **_chat("Short one", max_tokens=4, cache=False))
    done_short = api.wait(short["id"], 120)
    states = [api.get(j["id"]) for j in longs]
    assert done_short["status"] == "succeeded" and done_short["model"] == "llm"
    assert [j["model"] for j in states] == ["llm-long", "llm-long"]
    # The long engine takes one at a time: the second long prompt was still waiting or
    # running when the short one had already finished.
    assert any(j["status"] in ("queued", "running") for j in states), states
    for j in longs:
        api.http.post(f"/v1/jobs/{j['id']}/cancel")
    ended = [api.wait(j["id"], 120) for j in longs]
    assert all(j["status"] in ("canceled", "succeeded") for j in ended), ended
    assert all(
        _at(done_short["finished_at"]) < _at(j["finished_at"])
        for j in ended
        if j["status"] == "succeeded"
    )


def test_at_most_max_inflight_sequences_run_at_once(api: Api) -> None:
    jobs = [
        api.submit("llm", **_chat(f"Admission {i}", max_tokens=40, cache=False)) for i in range(7)
    ]
    ended = [api.wait(j["id"], 180) for j in jobs]
    assert all(j["status"] == "succeeded" for j in ended)
    spans = [(_at(j["started_at"]), _at(j["finished_at"])) for j in ended]
    most = max(sum(1 for s, f in spans if s <= start < f) for start, _ in spans)
    assert 1 < most <= 3  # max_inflight = 3: sequences overlap, never more than three


def test_cancel_stops_the_generation(api: Api) -> None:
    job = api.submit("llm", **_chat("Cancel me", max_tokens=LONG, cache=False))
    _wait_for_a_token(api, job["id"])
    assert api.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    ended = api.wait(job["id"], 60)
    assert ended["status"] == "canceled"
    after = api.wait(api.submit("llm", **_chat("Still serving", max_tokens=4))["id"], 120)
    assert after["status"] == "succeeded"


def _engine(dep: Deployment, reading: str) -> float:
    """The engine's own count (`running`, `generated`), through mmq's `/metrics`."""
    name = {
        "running": "mmq_engine_requests_running",
        "generated": "mmq_engine_generation_tokens_total",
    }
    return value(scrape(dep), name[reading], pipeline="llm")


@pytest.mark.engines("vllm", why="transformers serve reports nothing of itself (no /metrics)")
def test_a_cancel_and_a_client_that_goes_away_abort_the_sequence_in_the_engine(
    llm_dep: Deployment, api: Api
) -> None:
    """Each sequence would run for LONG tokens; once its job is canceled (or its client has
    gone) the engine runs nothing, having generated far fewer: it was aborted."""
    wait_until(lambda: _engine(llm_dep, "running") == 0, timeout_s=60)
    generated = _engine(llm_dep, "generated")
    job = api.submit("llm", **_chat("Abort me", max_tokens=LONG, cache=False))
    _wait_for_a_token(api, job["id"])
    wait_until(lambda: _engine(llm_dep, "running") == 1, timeout_s=60)
    assert api.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    wait_until(lambda: _engine(llm_dep, "running") == 0, timeout_s=60)
    assert api.wait(job["id"], 30)["status"] == "canceled"
    wait_until(lambda: _engine(llm_dep, "generated") > generated, timeout_s=60)
    assert _engine(llm_dep, "generated") - generated < LONG

    generated = _engine(llm_dep, "generated")
    body = {"model": "llm", "max_tokens": LONG, "stream": True, "cache": False}
    body["messages"] = [{"role": "user", "content": "Leave me"}]
    with api.http.stream("POST", "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        left = response.headers["X-Job-Id"]
        chunks = (line for line in response.iter_lines() if '"content"' in line)
        for _ in range(3):  # the engine is generating it
            next(chunks)
    # The client went away: its job is canceled and the sequence aborted.
    assert api.wait(left, 60)["status"] == "canceled"
    wait_until(lambda: _engine(llm_dep, "running") == 0, timeout_s=60)
    wait_until(lambda: _engine(llm_dep, "generated") > generated, timeout_s=60)
    assert _engine(llm_dep, "generated") - generated < LONG


def test_stop_ends_the_answer_before_its_string_streamed_and_whole(
    oai: openai.OpenAI, engine: str
) -> None:
    messages: Any = [{"role": "user", "content": "Stop somewhere"}]
    plain = {"model": "llm", "messages": messages, "max_tokens": 24, "temperature": 0}
    if engine == "transformers":  # its continuous batching runs through a stop string
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            oai.chat.completions.create(**plain, stop=["x"])
        assert refused.value.body["param"] == "stop"  # type: ignore[index]
        return
    text = oai.chat.completions.create(**plain, extra_body={"cache": False})
    full = text.choices[0].message.content or ""
    # A stop string of plain letters that first occurs after the answer's start.
    at = next(i for i in range(2, len(full) - 2) if full[i : i + 2].isalpha()
              and full.find(full[i : i + 2]) == i)  # fmt: skip
    stop = full[at : at + 2]
    whole = oai.chat.completions.create(**plain, stop=[stop], extra_body={"cache": False})
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].message.content == full[:at]
    chunks = list(oai.chat.completions.create(**plain, stop=[stop], stream=True,
                                              extra_body={"cache": False}))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full[:at]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.engines("transformers", why=BEFORE_THE_ENGINE)
def test_priorities_and_429_are_decided_before_the_engine(llm_dep: Deployment, api: Api) -> None:
    """Three sequences fill the engine (max_inflight = 3); what waits is mmq's to order: a
    high-priority job sent last starts before the low ones, and past the queue's limit
    (MAX_QUEUED) a submit gets 429 with Retry-After."""
    sent: list[str] = []
    try:
        blockers = [
            api.submit("llm", **_chat(f"Block {i}", max_tokens=LONG, cache=False)) for i in range(3)
        ]
        sent += [j["id"] for j in blockers]
        for job in blockers:
            _wait_for_a_token(api, job["id"])
        lows = [
            api.submit("llm", "low", **_chat(f"Low {i}", max_tokens=4, cache=False))
            for i in range(3)
        ]
        high = api.submit("llm", "high", **_chat("High", max_tokens=4, cache=False))
        sent += [j["id"] for j in (*lows, high)]
        room = MAX_QUEUED - len(lows) - 1
        more = [api.http.post("/v1/jobs", json={"kind": "llm", "input": _chat(f"More {i}")})
                for i in range(room + 1)]  # fmt: skip
        sent += [r.json()["id"] for r in more if r.status_code == 202]
        assert [r.status_code for r in more] == [202] * room + [429], [r.text for r in more]
        assert int(more[-1].headers["Retry-After"]) > 0
        for r in more[:room]:
            api.http.post(f"/v1/jobs/{r.json()['id']}/cancel")
        api.http.post(f"/v1/jobs/{blockers[0]['id']}/cancel")
        done_high = api.wait(high["id"], 120)
        done_lows = [api.wait(j["id"], 120) for j in lows]
        assert done_high["status"] == "succeeded"
        assert all(_at(done_high["started_at"]) <= _at(j["started_at"]) for j in done_lows)
    finally:  # nothing of this test left to hold the engine or the queue
        for job_id in sent:
            api.http.post(f"/v1/jobs/{job_id}/cancel")


@pytest.mark.engines("transformers", why=BEFORE_THE_ENGINE)
@pytest.mark.parametrize(
    ("inp", "param"),
    [
        ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),
        ({"messages": []}, "input.messages"),
        ({"prompt": "x", "max_tokens": 10**6}, "input.max_tokens"),
        ({"prompt": "x", "temperature": 3}, "input.temperature"),
        ({"prompt": "x", "model": "gpt-9"}, "input.model"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "input.messages.0.role"),
    ],
)
def test_bad_llm_input_gets_422_naming_the_field(api: Api, inp: dict[str, Any], param: str) -> None:
    r = api.http.post("/v1/jobs", json={"kind": "llm", "input": inp})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == param


@pytest.fixture
def oai(llm_dep: Deployment, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{llm_dep.base_url}/v1", api_key=api.key, max_retries=0)


def test_openai_client_chat_streams_the_same_text_it_answers_whole(oai: openai.OpenAI) -> None:
    messages: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = oai.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=10, temperature=0,
        extra_body={"cache": False},
    )  # fmt: skip
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 10
    stream = oai.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache": False},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # tokens that arrive together may
    # go out as one delta: tests/test_llm_relay.py sees them in pieces, a step apart
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_cached_answer_streams_whole_from_the_openai_route(oai: openai.OpenAI, api: Api) -> None:
    """A cached answer's job ends inside its submit, before the route streams a byte: the
    route joined the job's events before storing it, so the stream still has all of it."""
    messages: Any = [{"role": "user", "content": "Stream me from the cache"}]
    whole = oai.chat.completions.create(
        model="tiny-chat", messages=messages, max_tokens=6, temperature=0
    )
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny-chat", messages=messages, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(raw.parse())
    assert api.get(raw.headers["X-Job-Id"])["output"]["cached"] is True
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_openai_client_completions_and_models(oai: openai.OpenAI) -> None:
    done = oai.completions.create(model="llm", prompt="Once upon", max_tokens=6, temperature=0)
    assert done.usage is not None and done.usage.completion_tokens == 6
    streamed = oai.completions.create(
        model="llm", prompt="Once upon", max_tokens=6, temperature=0, stream=True,
        extra_body={"cache": False},
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed if c.choices) == done.choices[0].text
    models = {m.id: m for m in oai.models.list()}
    assert {"llm", "llm-long", "tiny-chat", "echo", "sleep"} <= set(models)
    assert models["tiny-chat"].model_extra == {"kind": "llm", "pipeline": "llm"}
    # The model is loaded from a directory here: no path on the host is shown.
    assert not [m for m in models if m.startswith("/")]


def test_openai_errors_name_the_field(oai: openai.OpenAI, engine: str) -> None:
    if engine == "transformers":  # it would drop `n` without a word: refused by name
        with pytest.raises(openai.UnprocessableEntityError) as bad_n:
            oai.chat.completions.create(
                model="tiny-chat", messages=[{"role": "user", "content": "x"}], n=2
            )
        assert bad_n.value.body["param"] == "n"  # type: ignore[index]
    else:  # vLLM honours it
        two = oai.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "x"}], n=2, max_tokens=3
        )
        assert [c.index for c in two.choices] == [0, 1]
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.UnprocessableEntityError) as no_tools:
        oai.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "x"}], tools=[tool]
        )
    assert no_tools.value.body["param"] == "tools"  # type: ignore[index]
    assert "does not render tools" in no_tools.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError) as bad_model:
        oai.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert bad_model.value.body["param"] == "model"  # type: ignore[index]


def _children(worker: Proc) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-P", str(worker.process.pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]


def _engine_pid(worker: Proc) -> int:
    pids = _children(worker)
    assert len(pids) == 1, pids
    return pids[0]


def test_a_dead_engine_is_restarted_and_its_jobs_come_back(llm_dep: Deployment, api: Api) -> None:
    worker = next(p for p in llm_dep.procs if p.name.startswith("worker-llm-long"))
    job = api.submit("llm", **_chat("x " * LONG_THRESHOLD * 2, max_tokens=600, cache=False))
    _wait_for_a_token(api, job["id"])
    old = _engine_pid(worker)
    os.kill(old, signal.SIGKILL)
    ended = api.wait(job["id"], 240)
    assert ended["status"] == "succeeded" and ended["attempts"] == 2, ended
    assert ended["output"]["usage"]["completion_tokens"] == 600
    assert _engine_pid(worker) != old and worker.alive()
    assert "died; restarting it" in worker.log()
    # What the killed server had started (vLLM's engine core and model worker) went too.
    assert live_in_group(old) == []


def test_a_worker_killed_mid_stream_leaves_no_engine_and_its_job_runs_again(
    llm_dep: Deployment, api: Api
) -> None:
    worker = next(p for p in llm_dep.procs if p.name.startswith("worker-llm-long"))
    job = api.submit("llm", **_chat("y " * LONG_THRESHOLD * 2, max_tokens=LONG, cache=False))
    _wait_for_a_token(api, job["id"])
    engine = _engine_pid(worker)
    worker.kill()
    wait_until(lambda: live_in_group(engine) == [], timeout_s=60)
    llm_dep.procs.remove(worker)
    fresh = llm_dep.spawn("worker-llm-long-2", "worker", "--pipeline", "llm-long")

    def again() -> bool:
        state = api.get(job["id"])
        return state["attempts"] == 2 and state["status"] in ("running", "succeeded")

    wait_until(again, fresh, timeout_s=300)
    api.http.post(f"/v1/jobs/{job['id']}/cancel")  # no need to see all 3000 tokens again
    ended = api.wait(job["id"], 60)
    assert ended["status"] in ("canceled", "succeeded") and ended["attempts"] == 2, ended


@pytest.mark.engines(
    "transformers",
    why="the start for a job and the stop when idle are mmq's, the same for each engine; "
    "vLLM's own part, everything its server started going with it, is checked by the dead "
    "engine and killed worker tests here (two more vLLM starts would cost CI 80 s)",
)
def test_an_on_demand_engine_starts_for_a_job_stops_when_idle_and_starts_again(
    llm_dep: Deployment, api: Api
) -> None:
    worker = next(p for p in llm_dep.procs if p.name == "worker-llm-od")
    wait_until(lambda: _children(worker) == [], worker, timeout_s=60)  # cold: no engine yet

    def ask(text: str) -> dict[str, Any]:
        job = api.submit("llm", model="llm-od", **_chat(text, max_tokens=4, cache=False))
        return api.wait(job["id"], 300)

    first = ask("Wake up")
    assert first["status"] == "succeeded" and first["timings"]["load_ms"] > 0, first
    engine = _engine_pid(worker)
    # Idle for idle_unload_s: the engine is stopped, everything it started with it.
    wait_until(lambda: _children(worker) == [] and live_in_group(engine) == [], timeout_s=60)
    again = ask("Once more")
    assert again["status"] == "succeeded" and again["timings"]["load_ms"] > 0, again
    assert _engine_pid(worker) != engine


def test_an_engine_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    options = LlmOptions(engine="transformers", startup_timeout_s=120)
    spec = EngineSpec("broken", str(tmp_path / "no-such-model"), "cpu", options, tmp_path)
    server = EngineServer(spec)
    with pytest.raises(EngineStartError, match=r"log .* ends with"):
        server.start()
    assert not server.alive()


def test_many_concurrent_streams_all_finish(oai: openai.OpenAI) -> None:
    def one(i: int) -> str:
        stream = oai.chat.completions.create(
            model="llm", messages=[{"role": "user", "content": f"n{i}"}], max_tokens=8,
            temperature=0, stream=True, extra_body={"cache": False},
        )  # fmt: skip
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(one, range(8)))
    assert len(texts) == 8 and all(texts)  # 8 streams over 3 engine slots: all end


def test_metrics_count_an_llm_job_with_its_tpot(llm_dep: Deployment, api: Api) -> None:
    def run() -> dict[str, Any]:
        job = api.submit("llm", **_chat("Count me", max_tokens=8, cache=False))
        return api.wait(job["id"], 120)

    check_job_counted(llm_dep, run, "llm", "llm", (*JOB_HISTOGRAMS, "time_per_output_token"))
