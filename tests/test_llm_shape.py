"""One request shape: the `llm` job's input is OpenAI's chat or completions body as the API
validated it, stored as it is (`LlmInput.record()`), and the worker forwards it to the
engine without validating it again, setting only what mmq must (the engine's model name,
streaming with usage, the completions API's `logprobs`)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from api.openai.chat_models import ChatRequest, CompletionRequest
from jobs.schemas.llm import LlmInput
from jobs.settings import PipelineConfig
from pipelines.llm.engine_client import request_body
from pipelines.llm.images import inline_images

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16

TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": {"type": "object"}}}


def _stored(**fields: Any) -> dict[str, Any]:
    """The record the API stores for these fields, validated once."""
    return LlmInput.model_validate(fields).record()


def test_a_chat_request_reaches_the_engine_as_it_was_stored() -> None:
    record = _stored(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "tool_calls": [
                {"id": "c1", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
        tools=[TOOL], response_format=SCHEMA, temperature=0.3, stop=["\n"], seed=7,
        max_tokens=32, cache=False, model="qwen",
    )  # fmt: skip
    path, body = request_body(record, "served-name")
    assert path == "/v1/chat/completions"
    mmq_sets = {"model", "stream", "stream_options"}
    assert {k: v for k, v in body.items() if k not in mmq_sets} == {
        k: v for k, v in record.items() if k not in {"cache", "model"}
    }
    assert body["model"] == "served-name" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    # OpenAI's names and shape: the schema under its alias, nothing left unset as null.
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["messages"][2] == {
        "role": "assistant",
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
        ],
    }  # fmt: skip
    assert body["tools"] == [TOOL] and body["temperature"] == 0.3 and body["seed"] == 7
    assert "cache" not in body and None not in _values(body)


def test_a_completion_request_gets_the_completions_apis_logprobs() -> None:
    path, body = request_body(_stored(prompt="Once", logprobs=True, top_logprobs=3), "m")
    assert path == "/v1/completions" and body["prompt"] == "Once"
    assert body["logprobs"] == 3 and "top_logprobs" not in body
    _, plain = request_body(_stored(prompt="Once"), "m")
    assert "logprobs" not in plain and "top_logprobs" not in plain


def test_the_worker_reads_the_record_without_validating_it_again() -> None:
    record = _stored(messages=[{"role": "user", "content": "hi"}], n=2, logprobs=True)
    read = LlmInput.from_record(record)
    assert read.record() == record
    assert (read.n, read.logprobs, read.max_tokens, read.model) == (2, True, 256, None)
    # Not validated: a field the API would refuse is not looked at again (the API is
    # the one place that validates; the record is what it stored).
    assert LlmInput.from_record({**record, "n": 99}).n == 99


def test_a_request_stored_before_the_one_shape_reaches_the_engine_without_nulls() -> None:
    """A job queued by the version before (its input dumped with every field, nulls too)
    and run after an upgrade: its engine body leaves out what was unset, as a new one's."""
    fields = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    old = LlmInput.model_validate(fields).model_dump(mode="json")
    assert old["prompt"] is None and old["messages"][0]["tool_calls"] is None
    _, body = request_body(LlmInput.from_record(old).record(), "m")
    assert None not in _values(body)
    assert body == request_body(_stored(**fields), "m")[1]


def test_the_api_and_the_worker_hash_the_same_cached_request() -> None:
    config = PipelineConfig(kind="llm", impl="pipelines.llm:LlmPipeline", model="tiny")
    fields = {"messages": [{"role": "user", "content": "2+2?"}], "temperature": 0, "seed": 1}
    at_submit = LlmInput.model_validate(fields).cache_policy(config)
    at_the_end = LlmInput.from_record(_stored(**fields)).cache_policy(config)
    assert at_submit is not None and at_the_end is not None
    assert at_submit.digest == at_the_end.digest
    other = LlmInput.model_validate({**fields, "max_tokens": 9}).cache_policy(config)
    assert other is not None and other.digest != at_submit.digest


def test_images_go_inline_for_the_engine_and_the_record_is_left_as_it_was() -> None:
    part = {"type": "image_url", "image_url": {"url": "file_abc"}}
    record = _stored(messages=[{"role": "user", "content": [{"type": "text", "text": "?"}, part]}])
    opened: list[tuple[str, str]] = []

    def open_input(ref: str, field: str) -> io.BytesIO:
        opened.append((ref, field))
        return io.BytesIO(PNG)

    _, body = request_body(record, "m")
    body["messages"] = inline_images(body["messages"], open_input, 1024)
    sent = body["messages"][0]["content"][1]["image_url"]["url"]
    assert sent.startswith("data:image/png;base64,")
    assert opened == [("file_abc", "input.messages.0.content.1.image_url.url")]
    assert record["messages"][0]["content"][1]["image_url"]["url"] == "file_abc"
    with pytest.raises(Exception, match="over the limit"):
        inline_images(record["messages"], open_input, 8)


def _values(value: object) -> list[object]:
    """Every value in a JSON document, at any depth."""
    if isinstance(value, dict):
        return [v for item in value.values() for v in [item, *_values(item)]]
    if isinstance(value, list):
        return [v for item in value for v in [item, *_values(item)]]
    return []


OPENAI_BODIES: list[dict[str, Any]] = [
    {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    {"model": "m", "messages": [{"role": "developer", "content": "Terse."},
                                {"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}],
     "max_completion_tokens": 9, "stop": "\n", "temperature": 0, "seed": 3, "cache": False},
    {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                     {"type": "image_url", "image_url": {"url": "file_x",
                                                                        "detail": "low"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}],
     "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False,
     "response_format": SCHEMA, "logprobs": True, "top_logprobs": 2, "n": 2,
     "presence_penalty": 0.5, "frequency_penalty": -0.5, "top_p": 0.9, "stream": True},
]  # fmt: skip


@pytest.mark.parametrize("sent", OPENAI_BODIES, ids=["plain", "developer-and-parts", "everything"])
def test_an_openai_request_is_validated_once_into_the_input_the_job_api_takes(
    sent: dict[str, Any],
) -> None:
    """The chat route validates OpenAI's body once (`ChatRequest`, an `LlmInput`): its
    record is the job's input, one the job API's own validation takes as it is, field
    for field; a developer turn is stored as the system's."""
    request = ChatRequest.model_validate(sent)
    built = request.llm_input()
    assert built is request  # the request is the job's input: no second model
    record = built.record()
    assert LlmInput.model_validate(record).record() == record
    assert record["max_tokens"] == sent.get("max_completion_tokens", 256)
    assert not {"stream", "stream_options", "max_completion_tokens"} & set(record)
    turns = record["messages"]
    assert isinstance(turns, list)
    roles = [turn["role"] for turn in turns if isinstance(turn, dict)]
    assert roles == ["system" if m["role"] == "developer" else m["role"] for m in sent["messages"]]


def test_a_completion_request_becomes_the_job_input_the_same_way() -> None:
    sent = {"model": "m", "prompt": ["Once"], "logprobs": 2, "stop": ["."], "max_tokens": 4}
    built = CompletionRequest.model_validate(sent).llm_input()
    assert LlmInput.model_validate(built.record()).record() == built.record()
    assert (built.prompt, built.logprobs, built.top_logprobs) == ("Once", True, 2)
