"""The answers of `POST /v1/chat/completions` and `POST /v1/completions`: whole
(`ChatCompletion`, `Completion`) and as the chunks of a stream (`ChatCompletionChunk`,
`CompletionChunk`).

Tool call deltas and log probabilities are the engine's, passed on as it wrote them: they
are TypedDicts, so that a key it left out stays out and one it added stays in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from api.openai.protocol import OpenAIResponse, omitted

ENGINE_KEYS = ConfigDict(extra="allow")


class Usage(OpenAIResponse):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CalledFunction(OpenAIResponse):
    name: str
    arguments: str
    """The arguments as a JSON text, as the model wrote them."""


class ChatCompletionToolCall(OpenAIResponse):
    """A call the model made: its deltas joined."""

    id: str
    type: str = "function"
    function: CalledFunction


@with_config(ENGINE_KEYS)
class FunctionDelta(TypedDict, total=False):
    name: str | None
    arguments: str | None
    """More of the arguments' JSON text."""


@with_config(ENGINE_KEYS)
class ToolCallDelta(TypedDict, total=False):
    """A part of a call: its first delta brings its `id`, `type` and `function.name`."""

    index: int
    id: str | None
    type: str | None
    function: FunctionDelta


@with_config(ENGINE_KEYS)
class TopLogprob(TypedDict, total=False):
    token: str
    logprob: float
    bytes: list[int] | None


@with_config(ENGINE_KEYS)
class TokenLogprob(TopLogprob, total=False):
    top_logprobs: list[TopLogprob]


@with_config(ENGINE_KEYS)
class ChatLogprobs(TypedDict, total=False):
    content: list[TokenLogprob] | None
    """Each output token's log probability, with the most likely tokens where asked
    (`top_logprobs`)."""


@with_config(ENGINE_KEYS)
class CompletionLogprobs(TypedDict, total=False):
    """The completions API's log probabilities, a list per key with an entry per token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def call_delta(index: int, call: Mapping[str, Any]) -> ToolCallDelta:
    """A whole call of a job's output (`ChatCompletionToolCall`'s keys) as the one delta
    that makes it."""
    function = call["function"]
    return ToolCallDelta(
        index=index,
        id=call["id"],
        type=call["type"],
        function=FunctionDelta(name=function["name"], arguments=function["arguments"]),
    )


class ChatCompletionMessage(OpenAIResponse):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """The text; null where the model made tool calls alone."""
    tool_calls: list[ChatCompletionToolCall] | None = omitted()


class ChatChoice(OpenAIResponse):
    index: int
    message: ChatCompletionMessage
    finish_reason: str | None
    """`stop`, `length`, `tool_calls`...: the engine's."""
    logprobs: ChatLogprobs | None = None


class ChatCompletion(OpenAIResponse):
    id: str
    """`chatcmpl-` and the job's id."""
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    """The model as the request named it."""
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(OpenAIResponse):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(OpenAIResponse):
    id: str
    """`cmpl-` and the job's id."""
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatDelta(OpenAIResponse):
    role: Literal["assistant"] | None = omitted()
    """In each choice's first chunk."""
    content: str | None = omitted()
    tool_calls: list[ToolCallDelta] | None = omitted()


class ChatChunkChoice(OpenAIResponse):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    """In each choice's last chunk."""
    logprobs: ChatLogprobs | None = omitted()


class ChatCompletionChunk(OpenAIResponse):
    """One event of a streamed chat completion: a delta of a choice, a choice's finish, or
    (`stream_options.include_usage`) the usage, with no choice, before `[DONE]`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = omitted()


class CompletionChunk(OpenAIResponse):
    """One event of a streamed text completion (OpenAI names it `text_completion` too)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = omitted()
