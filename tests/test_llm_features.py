"""What today's OpenAI clients send, through mmq with the official client, against real
engine processes:

- tool calling end to end on `transformers serve` with a model that calls a tool
  (`harness.models.tool_caller`): `tool_calls` in the answer, as streamed deltas,
  in the job's output and partial events, and a conversation with the call and its
  result sent back;
- what only vLLM honours (`tool_choice`, `parallel_tool_calls`, `response_format`,
  `logprobs`, `n`, `presence_penalty`) reaches the engine as the client sent it: shown on
  `bench.synthetic_engine`, which records what it receives and writes vLLM's wire format
  for `n` and `logprobs`, so that mmq's relay of several choices and of log
  probabilities is checked too (the engine makes up their values: it is not a stand-in
  for vLLM's behaviour);
- image parts reach a vision-language model on `transformers serve`
  (`harness.models.vision`) as data URLs and as stored file keys, and a model that
  takes none refuses them by name;
- the response cache keys on `response_format`.
"""

from __future__ import annotations

import base64
import io
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from common.procs import free_port
from common.sse import parse_lines
from harness.client import Api, new_owner
from harness.deploy import Deployment, flush, serving, wait_until
from harness.kinds import llm_toml
from harness.models.tool_caller import ARGUMENTS, TOOL, cached_tool_caller
from harness.models.vision import IMAGE_TOKENS, cached_tiny_vlm

TRANSFORMERS = {"engine": "transformers", "max_inflight": 2, "startup_timeout_s": 180}
VLLM_FEATURES = ["tools", "tool_choice", "response_format", "logprobs", "n", "presence_penalty"]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": TOOL,
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Engines:
    def __init__(self, dep: Deployment, wire_url: str) -> None:
        self.dep = dep
        self.wire_url = wire_url

    def received(self, marker: str) -> list[dict[str, Any]]:
        """The bodies the synthetic engine received whose messages or prompt hold
        `marker`."""
        got = httpx.get(f"{self.wire_url}/requests", timeout=5).json()
        return [r["body"] for r in got if marker in json.dumps(r["body"])]


@pytest.fixture(scope="module")
def engines(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    model = cached_tool_caller(tmp_path_factory)
    vlm = cached_tiny_vlm(tmp_path_factory)
    flush(redis_url)
    port = free_port()
    env = {"HF_HUB_OFFLINE": "1", "MMQ_LEASE__TTL_S": "3", "MMQ_LEASE__HEARTBEAT_S": "0.5"}
    dep = Deployment(redis_url, tmp_path_factory.mktemp("features"), env_overrides=env)
    wire = {"engine": "url", "engine_url": f"http://127.0.0.1:{port}", "max_inflight": 8}
    extra = (
        llm_toml("tools", str(model), TRANSFORMERS, aliases=["tool-caller"])
        + llm_toml("vision", str(vlm), TRANSFORMERS)
        + llm_toml("wire", "synthetic", wire | {"engine_features": VLLM_FEATURES})
    )
    dep.config_path.write_text(dep.config_path.read_text() + extra)
    with serving(dep):
        engine = dep.launch(
            "engine",
            [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port),
             "--step-ms", "5"],
        )  # fmt: skip
        wire_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{wire_url}/health"), engine, timeout_s=30)
        dep.start_api()
        dep.start_reaper()
        workers = [
            dep.spawn(f"worker-{n}", "worker", "--pipeline", n) for n in ("tools", "vision", "wire")
        ]
        for worker in workers:
            wait_until(lambda w=worker: "ready." in w.log(), worker, timeout_s=240)
        yield Engines(dep, wire_url)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def api(engines: Engines) -> Api:
    return new_owner(engines.dep.redis_url, engines.dep.base_url, f"feat{time.monotonic_ns()}")


@pytest.fixture
def oai(engines: Engines, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engines.dep.base_url}/v1", api_key=api.key, max_retries=0)


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
    assert len(deltas) == 1 and deltas[0].index == 0
    assert deltas[0].function is not None and deltas[0].function.name == TOOL
    assert json.loads(deltas[0].function.arguments or "") == ARGUMENTS
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
    # were rendered by the model's chat template into a longer prompt.
    assert first.usage is not None and second.usage is not None
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 40
    assert second.choices[0].finish_reason == "tool_calls"


def test_what_the_engine_can_honour_reaches_it_as_sent(
    oai: openai.OpenAI, engines: Engines
) -> None:
    marker = f"carried-{time.monotonic_ns()}"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": schema, "strict": True},
    }
    tool_choice: Any = {"type": "function", "function": {"name": TOOL}}
    oai.chat.completions.create(
        model="wire", messages=[{"role": "user", "content": marker}], max_tokens=3,
        tools=[WEATHER], tool_choice=tool_choice, parallel_tool_calls=False,
        response_format=response_format, logprobs=True, top_logprobs=2, n=2,
        presence_penalty=0.5,
    )  # fmt: skip
    [body] = engines.received(marker)
    assert body["tools"] == [WEATHER]
    assert body["tool_choice"] == tool_choice
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == response_format
    assert body["logprobs"] is True and body["top_logprobs"] == 2
    assert body["n"] == 2 and body["presence_penalty"] == 0.5

    prompt = f"completion-{marker}"
    oai.completions.create(model="wire", prompt=prompt, max_tokens=2, logprobs=3)
    [body] = engines.received(prompt)
    assert body["logprobs"] == 3  # the completions API's top-token count


def test_several_choices_and_log_probabilities_stream_and_answer_whole(
    oai: openai.OpenAI,
) -> None:
    kw: Any = {"model": "wire", "messages": [{"role": "user", "content": "Count."}]}
    whole = oai.chat.completions.create(**kw, max_tokens=4, n=2, logprobs=True, top_logprobs=1)
    assert [c.index for c in whole.choices] == [0, 1]
    for choice in whole.choices:
        assert choice.message.content == " tok" * 4 and choice.finish_reason == "length"
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert [e.token for e in choice.logprobs.content] == [" tok"] * 4
        assert all(len(e.top_logprobs) == 1 for e in choice.logprobs.content)
    assert whole.usage is not None and whole.usage.completion_tokens == 8

    stream = oai.chat.completions.create(
        **kw, max_tokens=4, n=2, logprobs=True, stream=True, extra_body={"cache": False}
    )
    texts: dict[int, str] = {0: "", 1: ""}
    tokens: dict[int, int] = {0: 0, 1: 0}
    roles: list[int] = []
    finish: dict[int, str | None] = {}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.delta.role:
                roles.append(choice.index)
            if choice.logprobs is not None and choice.logprobs.content:
                tokens[choice.index] += len(choice.logprobs.content)
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert texts == {0: " tok" * 4, 1: " tok" * 4}
    assert tokens == {0: 4, 1: 4} and sorted(roles) == [0, 1]
    assert finish == {0: "length", 1: "length"}

    done = oai.completions.create(model="wire", prompt="Count.", max_tokens=3, logprobs=1)
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens == [" tok"] * 3
    assert logprobs.token_logprobs is not None and len(logprobs.token_logprobs) == 3


def test_the_response_cache_keys_on_response_format(
    oai: openai.OpenAI, engines: Engines, api: Api
) -> None:
    marker = f"cache-{time.monotonic_ns()}"
    kw: Any = {
        "model": "wire", "messages": [{"role": "user", "content": marker}],
        "max_tokens": 2, "temperature": 0,
    }  # fmt: skip
    as_json: Any = {"type": "json_object"}
    first = oai.chat.completions.with_raw_response.create(**kw, response_format=as_json)
    plain = oai.chat.completions.with_raw_response.create(**kw)
    again = oai.chat.completions.with_raw_response.create(**kw, response_format=as_json)
    outputs = [api.get(r.headers["x-job-id"])["output"] for r in (first, plain, again)]
    assert [o["cached"] for o in outputs] == [False, False, True]
    assert len(engines.received(marker)) == 2


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


def test_images_are_refused_by_name_where_they_cannot_be_read(oai: openai.OpenAI) -> None:
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    with pytest.raises(openai.UnprocessableEntityError) as text_model:
        oai.chat.completions.create(model="tool-caller", messages=_look(data_url))
    assert text_model.value.body["param"] == "messages.0.content.1.image_url.url"  # type: ignore[index]
    assert "takes no images" in text_model.value.body["message"]  # type: ignore[index]
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
