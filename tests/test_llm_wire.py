"""mmq's relay of vLLM's wire format, against an engine process that records what it
receives and writes vLLM's shapes (`bench.synthetic_engine`): what only it can show next to
the real vLLM (tests/test_llm_features.py), because it answers with values made up to be
checked, not with a model's:

- every field a client sends that the engine honours (`tools`, `tool_choice`,
  `parallel_tool_calls`, `response_format`, `logprobs`, `n`, `presence_penalty`) reaches
  the engine exactly as sent;
- several choices and log probabilities, streamed and whole, relayed token for token;
- the response cache keys on `response_format`;
- `/v1/responses` becomes exactly the chat request it means, on an engine at a URL, and a
  background response's end is its job's signed webhook.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any, get_args

import httpx
import openai
import pytest
from standardwebhooks.webhooks import Webhook

from common.procs import free_port
from harness.api_client import Api, new_owner
from harness.kinds import llm_toml
from harness.models.tool_caller import TOOL, WEATHER_TOOL
from harness.webhook_receiver import receiving
from jobs.schemas.llm_options import Feature
from tests.conftest import WEBHOOK_SECRET
from tuning.deployment import Deployment, flush, responds, serving, wait_until

VLLM_FEATURES = [f for f in get_args(Feature) if f != "images"]
"""What vLLM honours but images (this engine takes none)."""
WEATHER: Any = WEATHER_TOOL


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
    flush(redis_url)
    port = free_port()
    env = {"HF_HUB_OFFLINE": "1", "MMQ_LEASE__TTL_S": "3", "MMQ_LEASE__HEARTBEAT_S": "0.5"}
    # Webhooks to the receiver on loopback (a background response's, below).
    env |= {"MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET, "MMQ_NET__ALLOW_PRIVATE_ADDRESSES": "true"}
    dep = Deployment(redis_url, tmp_path_factory.mktemp("wire"), env_overrides=env)
    wire = {"engine": "url", "engine_url": f"http://127.0.0.1:{port}", "max_inflight": 8}
    extra = llm_toml("wire", "synthetic", wire | {"engine_features": VLLM_FEATURES})
    dep.config_path.write_text(dep.config_path.read_text() + extra)
    with serving(dep):
        engine = dep.launch(
            "engine",
            [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port),
             "--step-ms", "5"],
        )  # fmt: skip
        wire_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: responds(f"{wire_url}/health"), engine, timeout_s=30)
        worker = dep.spawn("worker-wire", "worker", "--pipeline", "wire")
        hooks = dep.spawn("webhooks", "webhooks")
        dep.start()  # the API, the reaper and the scheduler, then all waited for
        dep.wait_started([worker, hooks])
        yield Engines(dep, wire_url)


@pytest.fixture
def api(engines: Engines) -> Api:
    return new_owner(engines.dep.redis_url, engines.dep.base_url, f"wire{time.monotonic_ns()}")


@pytest.fixture
def oai(engines: Engines, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engines.dep.base_url}/v1", api_key=api.key, max_retries=0)


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


def test_a_response_reaches_the_engine_as_the_chat_request_it_means(
    oai: openai.OpenAI, engines: Engines
) -> None:
    """`/v1/responses` on an engine at a URL: each Responses field becomes its chat field,
    the input items the chat turns, exactly."""
    marker = f"responded-{time.monotonic_ns()}"
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    function = WEATHER["function"]
    call = {"type": "function_call", "call_id": "call_7", "name": TOOL,
            "arguments": '{"city": "Paris"}'}  # fmt: skip
    items: Any = [
        {"role": "developer", "content": "Use the tools."},
        {"role": "user", "content": [{"type": "input_text", "text": marker}]},
        call,
        {"type": "function_call_output", "call_id": "call_7", "output": "clear"},
    ]
    oai.responses.create(
        model="wire", instructions="Be brief.", input=items, max_output_tokens=3,
        temperature=0.5, top_p=0.9, parallel_tool_calls=False,
        tools=[{"type": "function", "name": TOOL, "description": function["description"],
                "parameters": function["parameters"], "strict": None}],
        tool_choice={"type": "function", "name": TOOL},
        text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                         "strict": True}},
    )  # type: ignore[call-overload]  # fmt: skip
    [body] = engines.received(marker)
    assert [(m["role"], m.get("content")) for m in body["messages"]] == [
        ("system", "Be brief."), ("system", "Use the tools."), ("user", marker),
        ("assistant", None), ("tool", "clear"),
    ]  # fmt: skip
    assert body["messages"][3]["tool_calls"] == [
        {"id": "call_7", "type": "function",
         "function": {"name": TOOL, "arguments": '{"city": "Paris"}'}}
    ]  # fmt: skip
    assert body["messages"][4]["tool_call_id"] == "call_7"
    assert body["tools"] == [WEATHER]
    assert body["tool_choice"] == {"type": "function", "function": {"name": TOOL}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}
    }  # fmt: skip
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (3, 0.5, 0.9)


def test_a_background_response_s_end_is_a_signed_webhook_of_its_job(
    oai: openai.OpenAI, api: Api
) -> None:
    """A response is a job: its `webhook` (mmq's field) is delivered as any job's."""
    with receiving() as receiver:
        path = f"resp-{time.monotonic_ns()}"
        queued = oai.responses.create(
            model="wire", input="Hi", background=True, max_output_tokens=3,
            extra_body={"webhook": {"url": receiver.url(path)}},
        )  # fmt: skip
        wait_until(lambda: len(receiver.got(path)) == 1, timeout_s=30)
        ((headers, body),) = receiver.got(path)
    payload = Webhook(WEBHOOK_SECRET).verify(body, headers)
    assert payload["type"] == "status" and payload["data"]["status"] == "succeeded"
    assert payload["job_id"] == "job_" + queued.id.removeprefix("resp_")
    assert oai.responses.retrieve(queued.id).status == "incomplete"  # 3 tokens of more
