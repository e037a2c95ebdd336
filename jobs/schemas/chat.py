"""The parts of an OpenAI chat request, as mmq validates them: its turns and their
content, its tools and response format, its sampling. The `llm` job's input is built from
them (`jobs.schemas.llm.LlmInput`), and so is `POST /v1/chat/completions`'s request."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX, SEED_MAX, SEED_MIN
from jobs.schemas.requests import CLOSED, OpenAIBaseModel

MAX_CHOICES = 16
TEXT_MAX = 1_000_000
"""The longest text a message (or one of its parts) holds, in characters."""
TOOL_CALLS_MAX = 128
MESSAGES_MAX = 1000


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(max_length=1_000_000)
    """The arguments as a JSON text, as the model wrote them."""


class ToolCall(BaseModel):
    """A call an assistant turn made (OpenAI's `tool_calls` entry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=100_000)
    parameters: dict[str, Any] | None = None
    """A JSON Schema object."""
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(BaseModel):
    """`tool_choice` that forces one function."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    """A JSON Schema object."""
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`response_format`: plain text (the default), any JSON object, or JSON that a
    schema describes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type json_schema, and only then")
        return self


class ImageUrl(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(min_length=1, max_length=64 * 1024 * 1024)
    """A `data:image/…;base64,` URL, a stored file key, an `s3://` URL, or an http(s) URL
    (a signed one too), which the worker fetches behind the network guard."""
    detail: Literal["auto", "low", "high"] | None = None


NOT_YET = "mmq does not carry it to its LLM engines yet"
NOT_CARRIED: dict[str, str] = {
    "functions": "deprecated function calling: send tools",
    "function_call": "deprecated function calling: send tool_choice",
    "logit_bias": NOT_YET,
    "prediction": f"predicted outputs: {NOT_YET}",
    "reasoning_effort": f"reasoning options: {NOT_YET}",
    "verbosity": NOT_YET,
    "web_search_options": "web search is not served",
    "store": "stored completions are not served",
    "metadata": "stored completions are not served (a job's own metadata: POST /v1/jobs)",
    "service_tier": "service tiers are not served (priorities: POST /v1/jobs)",
    "prompt_cache_key": NOT_YET,
    "safety_identifier": NOT_YET,
    "user": NOT_YET,
    "best_of": NOT_YET,
    "echo": NOT_YET,
    "suffix": NOT_YET,
}
"""OpenAI request fields that mmq does not carry yet, with why; any other field that is
not one of the request's own is refused too (`jobs.schemas.requests`)."""

AudioFormat = Literal["wav", "mp3", "flac", "opus", "ogg", "webm", "m4a"]


class InputAudio(OpenAIBaseModel):
    data: str = Field(min_length=1)
    """The audio, base64: at most `limits.audio_max_bytes` once decoded (413 above)."""
    format: AudioFormat
    """What FFmpeg reads: `wav` and `mp3` as OpenAI takes them, and the other containers
    of `/v1/audio/transcriptions`."""


class ContentPart(OpenAIBaseModel):
    """A part of a turn's content: `text`, an `image_url`, or `input_audio` (speech, which
    `POST /v1/chat/completions` has an `asr` job transcribe first: `api.openai.chat_audio`)."""

    not_carried = NOT_CARRIED

    type: str
    text: str | None = Field(default=None, max_length=TEXT_MAX)
    image_url: ImageUrl | None = None
    """An `image_url` part's image: a data URL, a stored file key, an s3:// or an http(s)
    URL."""
    input_audio: InputAudio | None = None
    """An `input_audio` part's speech: an `asr` job transcribes it, and its transcript is
    the text the LLM reads."""

    def refuse_values(self, where: str) -> None:
        carried = {"text": self.text, "image_url": self.image_url, "input_audio": self.input_audio}
        if self.type not in carried:
            why = f"{self.type} parts are not served by mmq's LLM pipelines (text, images, audio)"
            raise InputError(f"{where}type", why)
        if carried[self.type] is None:
            raise InputError(f"{where}{self.type}", f"a {self.type} part needs its {self.type}")


DATA_URL = re.compile(r"^data:(image/(?:png|jpeg|gif|webp));base64,", re.IGNORECASE)
"""The data URLs an image part may be: what vision models' processors read."""


class ChatFeatures(BaseModel):
    """The fields of a chat request beyond plain text generation, the same in OpenAI's
    request and in the job input (one definition for both)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    tools: Annotated[list[Tool], Field(min_length=1, max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    """Each output token's log probability, in the partial events and the output."""
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    """With `logprobs`: this many most likely tokens at each position."""

    @model_validator(mode="after")
    def _top_with_logprobs(self) -> Self:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs")
        return self


def check_turn(role: str, content: object, tool_calls: object, tool_call_id: object) -> None:
    """What a chat turn of each role holds (a ValueError where it breaks that): the one
    rule of OpenAI's request and of the job input."""
    if tool_calls is not None and role != "assistant":
        raise ValueError("tool_calls belong to assistant turns")
    if (tool_call_id is not None) != (role == "tool"):
        raise ValueError("a tool turn, and only a tool turn, names its tool_call_id")
    if content is None and not tool_calls:
        raise ValueError("content is required (an assistant turn may give tool_calls instead)")


class Sampling(BaseModel):
    """How a chat or completion request samples, the same in OpenAI's requests and in
    the job input (one definition for both)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_tokens: int = Field(default=256, ge=1, le=COUNT_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    """A string, or up to 4, where the answer ends (not included)."""
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    """Choices to generate for the prompt, in one job."""
    cache: bool = True
    """mmq's: answer a deterministic request (temperature 0) from the response cache."""


class ChatMessage(OpenAIBaseModel):
    """A turn of a chat request, as OpenAI's clients send it."""

    model_config = ConfigDict(
        frozen=True,
        # What `_shape_of_its_role` checks, as far as a schema says it.
        json_schema_extra={
            **CLOSED,
            "anyOf": [{"required": ["content"]}, {"required": ["tool_calls"]}],
        },
    )
    not_carried = NOT_CARRIED

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    """`developer` is the system's (stored and sent as `system`); `function` turns are
    refused (send tool turns)."""
    content: str | list[ContentPart] | None = Field(default=None, max_length=TEXT_MAX)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=TOOL_CALLS_MAX)
    """The calls an assistant turn made."""
    tool_call_id: str | None = Field(default=None, max_length=256)
    """The call a `tool` turn answers."""

    @model_validator(mode="after")
    def _shape_of_its_role(self) -> ChatMessage:
        if self.role != "function":  # refused by name (`refuse_values`)
            check_turn(self.role, self.content, self.tool_calls, self.tool_call_id)
        return self

    def refuse_values(self, where: str) -> None:
        if self.role == "function":
            raise InputError(f"{where}role", "deprecated function turns: send tool turns")

    def text(self) -> str:
        """What the turn costs in prompt text: its content and its calls."""
        calls = "".join(c.function.name + c.function.arguments for c in self.tool_calls or [])
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text or "" for part in content if part.type == "text")
        return (content or "") + calls

    def images(self) -> list[tuple[int, str]]:
        """(place among the parts, URL) of each image part."""
        if not isinstance(self.content, list):
            return []
        return [
            (j, part.image_url.url)
            for j, part in enumerate(self.content)
            if part.type == "image_url" and part.image_url is not None
        ]

    def audio_parts(self) -> list[tuple[int, InputAudio]]:
        """(place among the parts, audio) of each `input_audio` part."""
        if not isinstance(self.content, list):
            return []
        return [
            (j, part.input_audio)
            for j, part in enumerate(self.content)
            if part.type == "input_audio" and part.input_audio is not None
        ]
