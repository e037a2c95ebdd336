"""What today's OpenAI clients send, through mmq with the official client, on each engine
mmq starts, `transformers serve` and the real vLLM (its CPU build), each once per module:

- tool calling end to end with a model that calls a tool (`harness.models.tool_caller`;
  vLLM parses its calls with its `hermes` parser): `tool_calls` in the answer, as streamed
  deltas, in the job's output and partial events, and a conversation with the call and its
  result sent back;
- structured output (`response_format`: `json_object` and a strict `json_schema`), log
  probabilities, several choices (`n`) and `presence_penalty`: vLLM honours each (the
  answer parses and matches its schema), `transformers serve` would drop them, so mmq
  refuses them by name;
- what vLLM is chosen for: its prefix cache (hits read through mmq's `/metrics`), and LoRA
  adapters per request (random-weight adapters, `harness.models.lora`);
- image parts reach a vision-language model (`harness.models.vision`) on `transformers
  serve` as data URLs and as stored file keys, and a model that takes none refuses them by
  name. vLLM's CPU build cannot read them here (`NO_VISION_ON_VLLM_CPU`).

`tests/test_llm_wire.py` checks what only the synthetic engine can: every field reaching
the engine exactly as sent.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from PIL import Image

from common.sse import parse_lines
from harness.api_client import Api, new_owner
from harness.kinds import VLLM_TEST_ENV, VLLM_TEST_OPTIONS, llm_toml
from harness.models.llm import cached_tiny_llm
from harness.models.lora import cached_lora
from harness.models.tool_caller import (
    ARGUMENTS,
    FINAL_ANSWER,
    JSON_ANSWER,
    JSON_SCHEMA,
    TOOL,
    WEATHER_TOOL,
    cached_tool_caller,
)
from harness.models.vision import IMAGE_TOKENS, cached_tiny_vlm
from harness.realtime import open_session
from harness.scrape import scrape, value
from tuning.deployment import Deployment, flush, serving, wait_until

ENGINES: dict[str, dict[str, Any]] = {
    "transformers": {"engine": "transformers", "max_inflight": 2, "startup_timeout_s": 240},
    "vllm": VLLM_TEST_OPTIONS | {"max_inflight": 4, "startup_timeout_s": 240},
}
NO_VISION_ON_VLLM_CPU = (
    "vLLM's CPU build reads image parts with transformers' image processors, which import "
    "torchvision; PyPI's torchvision for torch 2.13 links CUDA and does not load beside the "
    "CPU torch, and the CPU wheel is on PyTorch's own index, which this machine and CI do "
    "not reach"
)
ADAPTERS = ("tiny-lora", "tiny-lora-2")
WEATHER: Any = WEATHER_TOOL
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Features:
    def __init__(self, dep: Deployment, base_model: Path) -> None:
        self.dep = dep
        self.base_model = base_model


@pytest.fixture(scope="module", params=list(ENGINES))
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def features(
    engine: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Features]:
    caller = str(cached_tool_caller(tmp_path_factory))
    base = cached_tiny_llm(tmp_path_factory)
    flush(redis_url)
    env = {"HF_HUB_OFFLINE": "1", "MMQ_LEASE__TTL_S": "10", "MMQ_LEASE__HEARTBEAT_S": "1"}
    dep = Deployment(
        redis_url, tmp_path_factory.mktemp(f"features-{engine}"), env_overrides=env | VLLM_TEST_ENV
    )
    options = ENGINES[engine]
    if engine == "vllm":
        pipelines = ["tools", "base"]
        tools = options | {"tool_call_parser": "hermes"}
        adapters = {
            name: str(cached_lora(tmp_path_factory, base, seed))
            for seed, name in enumerate(ADAPTERS)
        }
        extra = llm_toml("tools", caller, tools, aliases=["tool-caller"])
        extra += llm_toml("base", str(base), options | {"lora_modules": adapters})
    else:
        vlm = str(cached_tiny_vlm(tmp_path_factory))
        extra = llm_toml("tools", caller, options, aliases=["tool-caller"])
        extra += llm_toml("base", str(base), options) + llm_toml("vision", vlm, options)
        # `base` answers nothing here but refusals, which mmq gives at submit: no engine.
        pipelines = ["tools", "vision"]
    dep.config_path.write_text(dep.config_path.read_text() + extra)
    with serving(dep):
        workers = [dep.spawn(f"worker-{n}", "worker", "--pipeline", n) for n in pipelines]
        dep.start()  # the API, the reaper and the scheduler while the engines start
        dep.wait_started(workers, timeout_s=300)
        yield Features(dep, base)


@pytest.fixture
def api(features: Features) -> Api:
    return new_owner(features.dep.redis_url, features.dep.base_url, f"feat{time.monotonic_ns()}")


@pytest.fixture
def oai(features: Features, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{features.dep.base_url}/v1", api_key=api.key, max_retries=0)


def test_a_tool_call_comes_back_whole_streamed_and_in_the_job(oai: openai.OpenAI, api: Api) -> None:
    whole = oai.chat.completions.with_raw_response.create(
        model="tool-caller", messages=ASK, tools=[WEATHER], max_tokens=16
    )
    answer = whole.parse()
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call: Any = calls[0]
    assert call.type == "function" and call.id
    assert call.function.name == TOOL and json.loads(call.function.arguments) == ARGUMENTS
    assert not choice.message.content

    job = api.get(whole.headers["x-job-id"])  # the job's own record has the call too
    assert job["output"]["finish_reason"] == "tool_calls"
    assert job["output"]["tool_calls"] == [call.model_dump(exclude_none=True)]
    with api.http.stream("GET", f"/v1/jobs/{job['id']}/events") as response:
        events = [json.loads(m.data) for m in parse_lines(response.iter_lines())]
    partials = [e["data"] for e in events if e["type"] == "partial"]
    assert [p["tool_calls"][0]["function"]["name"] for p in partials if "tool_calls" in p] == [TOOL]

    chunks = list(
        oai.chat.completions.create(
            model="tool-caller", messages=ASK, tools=[WEATHER], max_tokens=16, stream=True
        )
    )
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    # One call, in one delta or in several (vLLM: its name, then its arguments), which a
    # client puts together by index.
    assert {d.index for d in deltas} == {0} and deltas[0].id
    assert [d.function.name for d in deltas if d.function and d.function.name] == [TOOL]
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(arguments) == ARGUMENTS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_conversation_with_the_call_and_its_result_is_carried(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(
        model="tool-caller", messages=ASK, tools=[WEATHER], max_tokens=16
    )
    call: Any = (first.choices[0].message.tool_calls or [])[0]
    messages: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear", "c": 21}'},
    ]
    second = oai.chat.completions.create(
        model="tool-caller", messages=messages, tools=[WEATHER], max_tokens=16,
        tool_choice="auto", parallel_tool_calls=True,
    )  # fmt: skip
    # The usage shows the engine read the whole conversation: the call and its result
    # were rendered by the model's chat template into a longer prompt, which it answers.
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 40
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == FINAL_ANSWER


def test_structured_output_parses_and_matches_its_schema(oai: openai.OpenAI, engine: str) -> None:
    strict: Any = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": JSON_SCHEMA, "strict": True},
    }
    if engine == "transformers":  # it would drop it without a word
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            oai.chat.completions.create(model="tool-caller", messages=ASK, response_format=strict)
        assert refused.value.body["param"] == "response_format"  # type: ignore[index]
        return
    plain = oai.chat.completions.create(model="tool-caller", messages=ASK, max_tokens=16)
    assert "<tool_call>" in (plain.choices[0].message.content or "")  # its first choice
    as_object: Any = {"type": "json_object"}
    for response_format in (as_object, strict):
        answer = oai.chat.completions.create(
            model="tool-caller", messages=ASK, max_tokens=16, response_format=response_format
        )
        parsed = json.loads(answer.choices[0].message.content or "")
        jsonschema.validate(parsed, JSON_SCHEMA)
        assert parsed == json.loads(JSON_ANSWER) and answer.choices[0].finish_reason == "stop"


def test_log_probabilities_choices_and_presence_penalty(oai: openai.OpenAI, engine: str) -> None:
    ask: Any = {"model": "base", "messages": [{"role": "user", "content": "Say something"}]}
    ask |= {"max_tokens": 24, "temperature": 0, "extra_body": {"cache": False}}
    if engine == "transformers":  # each would be dropped: refused by name
        sent: list[tuple[dict[str, Any], str]] = [
            ({"logprobs": True}, "logprobs"), ({"n": 2}, "n"),
            ({"presence_penalty": 1.5}, "presence_penalty"),
        ]  # fmt: skip
        for extra, param in sent:
            with pytest.raises(openai.UnprocessableEntityError) as refused:
                oai.chat.completions.create(**ask, **extra)
            assert refused.value.body["param"] == param  # type: ignore[index]
        return
    whole = oai.chat.completions.create(**ask, logprobs=True, top_logprobs=2)
    assert whole.choices[0].logprobs is not None
    entries = whole.choices[0].logprobs.content or []
    assert len(entries) == 24 and all(len(e.top_logprobs) == 2 for e in entries)
    # Greedy: each chosen token is the likeliest of its alternatives.
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in entries)

    with pytest.raises(openai.UnprocessableEntityError) as greedy:  # vLLM's rule, said first
        oai.chat.completions.create(**ask, n=2)
    assert greedy.value.body["param"] == "n"  # type: ignore[index]
    sampled = ask | {"temperature": 1.0, "seed": 7}
    two = oai.chat.completions.create(**sampled, n=2, logprobs=True)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.usage is not None and two.usage.completion_tokens == 48
    assert all(len(c.logprobs.content or []) == 24 for c in two.choices if c.logprobs)
    counted: dict[int, int] = {}
    finish: dict[int, str] = {}
    for chunk in oai.chat.completions.create(**sampled, n=2, logprobs=True, stream=True):
        for c in chunk.choices:
            got = len(c.logprobs.content or []) if c.logprobs is not None else 0
            counted[c.index] = counted.get(c.index, 0) + got
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert counted == {0: 24, 1: 24} and finish == {0: "length", 1: "length"}

    done = oai.completions.create(model="base", prompt="Once upon", max_tokens=5, logprobs=2,
                                  temperature=0, extra_body={"cache": False})  # fmt: skip
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    # Up to two alternatives a token (fewer where two tokens read the same, as two halves
    # of UTF-8 characters do: the dict keeps one).
    assert len(logprobs.top_logprobs) == 5 and all(1 <= len(t) <= 2 for t in logprobs.top_logprobs)

    # A strong presence penalty changes a greedy answer that repeats its tokens.
    penalized = oai.chat.completions.create(**ask, presence_penalty=2.0)
    assert penalized.choices[0].message.content != whole.choices[0].message.content


def _prefix_cache(dep: Deployment) -> tuple[float, float]:
    samples = scrape(dep)
    queries = value(samples, "mmq_engine_prefix_cache_queries_total", pipeline="base")
    return queries, value(samples, "mmq_engine_prefix_cache_hits_total", pipeline="base")


@pytest.mark.engines("vllm", why="transformers serve has no prefix cache to read")
def test_a_shared_prefix_is_read_from_vllms_prefix_cache(
    features: Features, oai: openai.OpenAI
) -> None:
    """Four prompts of about 2,000 tokens each (of the 4,096 the engine takes): with nothing
    in common the prefix cache holds none of them; sharing all but their last words, the
    three after the first are mostly read from it. Read through mmq's `/metrics`, which
    shows the engine's own counts."""

    def hit_ratio(prompts: list[str]) -> float:
        before = _prefix_cache(features.dep)
        looked_up = 0
        for prompt in prompts:
            answer = oai.completions.create(model="base", prompt=prompt, max_tokens=1,
                                            extra_body={"cache": False})  # fmt: skip
            assert answer.usage is not None and answer.usage.prompt_tokens > 1000
            looked_up += answer.usage.prompt_tokens
        # The worker reads the engine's counters every second: wait until the readings hold
        # every prompt's lookup (each looks up all its tokens), not just some, or the rest
        # would be counted in the next call's window.
        wait_until(lambda: _prefix_cache(features.dep)[0] - before[0] >= looked_up, timeout_s=30)
        after = _prefix_cache(features.dep)
        return (after[1] - before[1]) / (after[0] - before[0])

    stamp = time.monotonic_ns()
    apart = hit_ratio([" ".join(f"{i}w{stamp}y{k}" for k in range(100)) for i in range(4)])
    shared = " ".join(f"fact{stamp}n{k}" for k in range(100))
    together = hit_ratio([f"{shared} question {i}" for i in range(4)])
    assert apart < 0.1 and together > 0.3, (apart, together)
    assert value(scrape(features.dep), "mmq_engine_prefix_cache_hit_ratio", pipeline="base") > 0


@pytest.mark.engines(
    "vllm", why="transformers serve takes no adapters (lora_modules is refused there)"
)
def test_a_lora_adapter_answers_the_requests_that_name_it(
    features: Features, oai: openai.OpenAI
) -> None:
    ask: Any = {"messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 16}
    ask |= {"temperature": 0}

    def answer(model: str, cache: bool = False) -> str:
        done = oai.chat.completions.create(model=model, **ask, extra_body={"cache": cache})
        assert done.model == model
        return done.choices[0].message.content or ""

    base = answer("base", cache=True)
    adapted = answer(ADAPTERS[0])
    assert adapted != base and answer(ADAPTERS[0]) == adapted  # its own, every time
    assert answer(ADAPTERS[1]) not in (adapted, base)
    assert answer(ADAPTERS[0], cache=True) == adapted  # never the base's cached answer

    models = {m.id: m for m in oai.models.list()}
    for name in ADAPTERS:
        assert models[name].model_extra == {
            "kind": "llm",
            "pipeline": "base",
            "parent": "base",
        }
    # The base model is a directory here: listed by its pipeline's name, never its path.
    assert str(features.base_model) not in models
    with pytest.raises(openai.UnprocessableEntityError) as unknown:
        answer("tiny-lora-9")
    assert unknown.value.body["param"] == "model"  # type: ignore[index]
    assert "'tiny-lora-9'" in unknown.value.body["message"]  # type: ignore[index]


def _png(side: int = 40) -> bytes:
    image = Image.new("RGB", (side, side * 3 // 4), (200, 30, 30))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _look(url: str) -> Any:
    parts = [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return [{"role": "user", "content": parts}]


@pytest.mark.engines("transformers", why=NO_VISION_ON_VLLM_CPU)
def test_images_reach_a_vision_model_inline_and_by_file_key(oai: openai.OpenAI, api: Api) -> None:
    text_only = oai.chat.completions.create(
        model="vision", messages=[{"role": "user", "content": "What is it?"}], max_tokens=2
    )
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    inline = oai.chat.completions.create(model="vision", messages=_look(data_url), max_tokens=2)
    # The engine's processor turned the image into its tokens: the model read it.
    assert text_only.usage is not None and inline.usage is not None
    assert inline.usage.prompt_tokens == text_only.usage.prompt_tokens + IMAGE_TOKENS

    files = {"file": ("red.png", _png(64), "image/png")}
    key = api.http.post("/v1/files", files=files).json()["key"]
    by_key = oai.chat.completions.create(model="vision", messages=_look(key), max_tokens=2)
    assert by_key.usage is not None and by_key.usage.prompt_tokens == inline.usage.prompt_tokens

    not_an_image = api.http.post("/v1/files", files={"file": ("a.txt", b"hello", "text/plain")})
    job = api.submit(
        "llm", model="vision", messages=_look(not_an_image.json()["key"]), max_tokens=2
    )
    failed = api.wait(job["id"], timeout_s=60)
    assert failed["status"] == "failed" and failed["error"]["type"] == "invalid_input"
    assert "not a png, jpeg, gif or webp image" in failed["error"]["message"]


def test_a_text_model_refuses_image_parts_by_name(oai: openai.OpenAI) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    with pytest.raises(openai.UnprocessableEntityError) as text_model:
        oai.chat.completions.create(model="tool-caller", messages=_look(data_url))
    assert text_model.value.body["param"] == "messages.0.content.1.image_url.url"  # type: ignore[index]
    assert "takes no images" in text_model.value.body["message"]  # type: ignore[index]


@pytest.mark.engines("transformers", why=NO_VISION_ON_VLLM_CPU)
def test_images_a_vision_model_cannot_read_are_refused_by_name(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as not_png:
        oai.chat.completions.create(model="vision", messages=_look("data:text/plain;base64,aGk="))
    assert "data:image/(png|jpeg|gif|webp)" in not_png.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError) as missing:
        oai.chat.completions.create(model="vision", messages=_look("someone/uploads/x/y.png"))
    assert missing.value.body["param"] == "messages.0.content.1.image_url.url"  # type: ignore[index]
    huge = "data:image/png;base64," + base64.b64encode(b"\0" * (8 * 1024 * 1024 + 1)).decode()
    with pytest.raises(openai.APIStatusError) as too_large:
        oai.chat.completions.create(model="vision", messages=_look(huge))
    assert too_large.value.status_code == 413


def test_a_realtime_session_calls_a_function_and_reads_its_output(
    features: Features, api: Api
) -> None:
    """Function tools in a Realtime session, on each engine: the call comes back as a
    `function_call` item, and its output, sent back as an item, reaches the LLM."""
    session = open_session(features.dep.base_url, api.key, "model=tool-caller")
    assert session.next()["type"] == "session.created"
    function = WEATHER["function"]
    tool = {"type": "function", "name": TOOL, "description": function["description"],
            "parameters": function["parameters"]}  # fmt: skip
    session.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["text"],
                "tools": [tool],
                "max_output_tokens": 16,
            },
        }
    )
    assert (
        session.until(lambda e: e["type"] in ("session.updated", "error"))["type"]
        == "session.updated"
    )
    asked = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": ASK[0]["content"]}],
    }
    session.send({"type": "conversation.item.create", "item": asked})
    session.send({"type": "response.create"})
    done = session.until("response.done")
    assert done["response"]["status"] == "completed", done
    call = next(item for item in done["response"]["output"] if item["type"] == "function_call")
    assert call["name"] == TOOL and json.loads(call["arguments"]) == ARGUMENTS, call
    (arguments,) = session.of("response.function_call_arguments.done")
    assert arguments["call_id"] == call["call_id"] and arguments["name"] == TOOL
    result = {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": '{"sky": "clear"}',
    }
    session.send({"type": "conversation.item.create", "item": result})
    session.send({"type": "response.create"})
    assert session.until("response.done")["response"]["status"] == "completed"
    session.close()
    jobs = api.http.get("/v1/jobs", params={"kind": "llm"}).json()["data"]
    second = max(jobs, key=lambda j: j["created_at"])
    messages = second["input"]["messages"]
    assert messages[-1]["role"] == "tool" and messages[-1]["tool_call_id"] == call["call_id"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == TOOL


FLAT_WEATHER: Any = {"type": "function", "name": TOOL} | {
    k: WEATHER["function"][k] for k in ("description", "parameters")
}
"""The tool as the Responses API declares it (flat)."""


def _response_events(api: Api, **body: Any) -> list[dict[str, Any]]:
    r = api.http.post("/v1/responses", json=body | {"stream": True}, timeout=120)
    assert r.status_code == 200, r.text
    return [json.loads(m.data) for m in parse_lines(r.iter_lines())]


def test_a_response_calls_the_tool_streamed_and_whole_and_answers_its_result(
    oai: openai.OpenAI, api: Api
) -> None:
    """The Responses API's function calling (`/v1/responses`), translated to the engine's
    chat API: the call as an output item, streamed as its arguments' deltas, and the result
    sent back as a `function_call_output` item continuing the stored response."""
    asked = ASK[0]["content"]
    first = oai.responses.create(model="tool-caller", input=asked, tools=[FLAT_WEATHER],
                                 max_output_tokens=16)  # fmt: skip
    (call,) = first.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.name == TOOL and json.loads(call.arguments) == ARGUMENTS and call.call_id
    events = _response_events(api, model="tool-caller", input=asked, tools=[FLAT_WEATHER],
                              max_output_tokens=16)  # fmt: skip
    types = [e["type"] for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == [
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"
    ]  # fmt: skip
    added = events[2]["item"]
    assert added["type"] == "function_call" and added["name"] == TOOL
    deltas = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert json.loads(deltas) == ARGUMENTS == json.loads(events[-3]["arguments"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"c": 21}'}
    answer = oai.responses.create(
        model="tool-caller", input=[result], previous_response_id=first.id, tools=[FLAT_WEATHER],
        max_output_tokens=16,
    )  # fmt: skip
    assert answer.status == "completed" and answer.output_text == FINAL_ANSWER
    messages = api.get("job_" + answer.id.removeprefix("resp_"))["input"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]


def test_a_response_s_text_format_is_honoured_or_refused_by_name(
    oai: openai.OpenAI, engine: str
) -> None:
    strict: Any = {"format": {"type": "json_schema", "name": "answer", "schema": JSON_SCHEMA,
                              "strict": True}}  # fmt: skip
    if engine == "transformers":  # it would drop it without a word
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            oai.responses.create(model="tool-caller", input=ASK[0]["content"], text=strict)
        assert refused.value.body["param"] == "text.format"  # type: ignore[index]
        return
    for text in ({"format": {"type": "json_object"}}, strict):
        answer = oai.responses.create(
            model="tool-caller", input=ASK[0]["content"], text=text, max_output_tokens=16
        )  # type: ignore[arg-type]
        parsed = json.loads(answer.output_text)
        jsonschema.validate(parsed, JSON_SCHEMA)
        assert parsed == json.loads(JSON_ANSWER) and answer.status == "completed"


def test_an_agent_of_the_openai_agents_sdk_calls_its_tool_and_answers(
    features: Features, api: Api
) -> None:
    """The OpenAI Agents SDK's own loop on mmq's `/v1/responses`: the model calls the
    function tool, the SDK runs it and sends its result back, the model answers."""
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return '{"sky": "clear", "c": 21}'

    client = openai.AsyncOpenAI(
        base_url=f"{features.dep.base_url}/v1", api_key=api.key, max_retries=0
    )
    model = OpenAIResponsesModel(model="tool-caller", openai_client=client)
    agent = Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather],
                  model=model)  # fmt: skip
    run = Runner.run_sync(
        agent, ASK[0]["content"], max_turns=4, run_config=RunConfig(tracing_disabled=True)
    )
    assert asked == ["Paris"]
    assert run.final_output == FINAL_ANSWER
    # Two responses, each a job of this key: the call, then the answer to its result.
    jobs = api.http.get("/v1/jobs", params={"kind": "llm"}).json()["data"]
    assert len(jobs) == 2 and all(job["status"] == "succeeded" for job in jobs)
