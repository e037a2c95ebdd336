"""LLM (chat or completion) job input, and the options of an LLM pipeline."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr, model_validator

from jobs.errors import InputError, TooLarge
from jobs.schemas.base import COUNT_MAX, SEED_MAX, SEED_MIN, CachePolicy, JobInput, over_limit
from jobs.schemas.requests import CLOSED, OpenAIBaseModel, OpenAIRequest
from jobs.settings import Limits, PipelineConfig, Settings
from jobs.tokens import count_tokens

Feature = Literal[
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "n",
    "presence_penalty",
    "images",
    "stop",
]
"""What an engine may honour beyond plain text generation. A request that needs one its
pipeline's engine lacks is refused by name (422) at submit, never sent to an engine that
would drop it without a word."""

ENGINE_FEATURES: dict[str, frozenset[Feature]] = {
    "vllm": frozenset(get_args(Feature)),
    # `transformers serve` (5.23) renders `tools` into the chat template and parses the
    # model's calls back (Qwen, Gemma 4, or the tokenizer's own response template). It
    # drops `tool_choice`, `parallel_tool_calls`, `response_format`, `logprobs`, `n` and
    # `presence_penalty` with a log line (`UNUSED_CHAT_COMPLETION_FIELDS`). It reads image
    # parts for a vision-language model, and drops them for another (so does mmq's check:
    # `takes_images`).
    # It maps `stop` to `stop_strings`, which its continuous batching does not apply: an
    # answer runs through the stop string to max_tokens.
    "transformers": frozenset({"tools", "images"}),
    "url": frozenset({"stop"}),
}
"""What each engine honours, in one place: `LlmOptions.engine_features` overrides it (an
engine at a URL declares what it is)."""

FEATURE_NAMES: dict[Feature, str] = {
    "tools": "tool calling",
    "tool_choice": "tool_choice other than auto, or parallel_tool_calls false",
    "response_format": "structured output",
    "logprobs": "log probabilities",
    "n": "several choices (n > 1)",
    "presence_penalty": "presence_penalty",
    "images": "image parts",
    "stop": "stop sequences",
}


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


class LlmOptions(BaseModel):
    """`options` of an LLM pipeline (`[pipelines.NAME.options]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["transformers", "vllm", "url"] = "transformers"
    """The engine server: `vllm` (`vllm serve`, GPUs), `transformers` (`transformers
    serve`, CPU and tests), or `url`: one that already runs at `engine_url`."""
    engine_url: str | None = None
    """Base URL of a running OpenAI-compatible engine (`engine = "url"`)."""
    engine_bin: str | None = None
    """The engine's executable, e.g. `/opt/vllm/bin/vllm` from vLLM's own environment;
    default: `vllm` / `transformers` beside this Python, else on PATH."""
    engine_features: list[Feature] | None = None
    """What the engine honours beyond plain text (`tools`, `tool_choice`,
    `response_format`, `logprobs`, `n`, `presence_penalty`, `images`, `stop`); a request
    that needs another is refused with a 422 naming the field. Default: the engine's own
    (`ENGINE_FEATURES`: vLLM all of them, `transformers serve` tools and images); an engine
    at a URL declares its own (default: `stop`).
    """
    takes_tools: bool | None = None
    """Whether the model sees `tools`; unset: its chat template renders them (read where
    `model` is a local directory; a hub model is taken at its word)."""
    takes_images: bool | None = None
    """Whether the model reads image parts (a vision-language model); unset: read from
    its config.json where `model` is a local directory (a `vision_config`), else no."""
    tool_call_parser: str | None = None
    """vLLM: the parser of the model's tool calls (`hermes` for Qwen, `llama3_json`,
    `mistral`, …: vLLM's `--tool-call-parser`, with `--enable-auto-tool-choice`). Without
    it vLLM takes only a named or `required` `tool_choice`, and answers `auto` with an
    error that the client gets as a 422."""
    served_model_name: str | None = None
    """The model name the engine answers to; default: the pipeline's `model`."""
    lora_modules: dict[str, str] = Field(default_factory=dict)
    """LoRA adapters served beside the model, name -> directory (PEFT's
    `adapter_config.json` and weights): vLLM's `--lora-modules NAME=PATH`, with
    `--enable-lora`. A request names an adapter as its `model` (vLLM's convention) and is
    answered by it; `GET /v1/models` lists each with the pipeline's model as its `parent`.
    vLLM only (an engine at a URL: the names it serves)."""
    max_lora_rank: int = Field(default=16, ge=1, le=512)
    """The largest rank of the adapters (vLLM's `--max-lora-rank`)."""
    max_loras: int | None = Field(default=None, ge=1)
    """Adapters in one engine step (vLLM's `--max-loras`); default: vLLM's own."""
    max_inflight: int = Field(default=48, ge=1, le=4096)
    """Sequences the worker feeds the engine at once (its admission limit); the rest wait
    in the queue (priorities, 429). The engine is sized for this many (see
    `max_model_len`)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context (prompt + output tokens) per sequence. Unset: the model's
    `max_position_embeddings`, cut (down to 2048) until `max_inflight` sequences of it fit
    the memory the engine may have (the worker logs the numbers). Set: kept, and the
    engine runs fewer sequences at once instead (the rest wait inside it). When not even
    one sequence fits, the worker fails at once with the reason (`/readyz` shows it)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Sequences the engine's KV cache is sized for (vLLM's `--max-num-seqs`); default:
    `max_inflight`, cut to what fits."""
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    """Tokens per engine step (vLLM `--max-num-batched-tokens`, transformers
    `--cb-max-batch-tokens`). Default: vLLM's own; for `transformers serve` 512 on a CPU
    and 2048 on a GPU, because its attention mask takes this x the cache's tokens."""
    stream_interval: int = Field(default=1, ge=1, le=64)
    """vLLM: tokens it gathers per streamed chunk of a sequence (`--stream-interval`; the
    first token always goes at once). Much of what mmq's relay, Redis and API spend goes
    per chunk, whatever its tokens: at 4, mmq spent 0.56x the CPU per token of 1 in front
    of a synthetic engine (`bench.llm_ceiling --stream-interval 4`), and a stream's tokens
    arrive 4 engine steps apart. `mmq tune` tries 1 and 4."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    """Share of the GPU the engine takes (vLLM's flag); mmq sizes against the device's
    free memory x this."""
    quantization: str | None = None
    dtype: str = "auto"
    prefix_caching: bool = True
    cache_root: str | None = None
    """`VLLM_CACHE_ROOT` (torch.compile and CUDA-graph caches); default:
    `data_dir/engine-cache/PIPELINE`, kept across restarts."""
    extra_args: list[str] = Field(default_factory=list)
    """More command-line arguments for the engine server."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the engine server on 127.0.0.1; 0: a free one."""
    startup_timeout_s: float = Field(default=900.0, gt=0)
    """How long the engine may take to answer its first generation. An engine that exits,
    answers with a fatal error or logs one (out of memory, a CUDA error, a dead engine
    core) ends the wait at once."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest silence on a request's token stream before it counts as lost."""
    long_prompt_threshold: int = Field(default=5000, ge=1)
    """Prompts over this many tokens go to `long_pipeline`."""
    long_pipeline: str | None = None
    """The pipeline (its own engine and queue) that serves long prompts."""
    tokenizer: str | None = None
    """tokenizer.json (or a directory with one) the API counts prompt tokens with;
    default: the model directory's, else characters / 4."""
    cache_ttl_s: float = Field(default=3600.0, ge=0)
    """How long a deterministic answer (temperature 0) is reused; 0: no response cache."""
    sleep_mode: bool | None = None
    """vLLM with `residency = "on_demand"`: an unload puts the engine to sleep (vLLM's
    sleep mode, level 1: the weights to host memory, the KV cache dropped, the GPU's memory
    given back) instead of stopping it, and the next load wakes it, in seconds rather
    than a whole start. The engine runs with `--enable-sleep-mode` and
    `VLLM_SERVER_DEV_MODE=1` (which also serves vLLM's other development routes on its
    loopback port). Unset: on for vLLM on a GPU when on demand."""

    @model_validator(mode="after")
    def _vllm_only(self) -> LlmOptions:
        if self.sleep_mode and self.engine != "vllm":
            raise ValueError("sleep_mode is vLLM's: it needs engine = 'vllm'")
        if self.lora_modules and self.engine == "transformers":
            raise ValueError(
                "lora_modules needs engine = 'vllm' (or 'url', an engine that serves them): "
                "transformers serve takes no adapters"
            )
        return self


class LlmInput(OpenAIRequest, JobInput, Sampling, ChatFeatures):
    """OpenAI's chat (`messages`) or completions (`prompt`) body, with mmq's `cache`: what
    `POST /v1/chat/completions` validates (`api.openai.chat_models.ChatRequest` adds only
    what is the route's: streaming, spoken answers), and what the job stores and its
    worker sends to the engine (`record`)."""

    model_config = ConfigDict(
        extra="allow",  # kept aside to be refused by name (`OpenAIRequest`)
        json_schema_extra={
            **CLOSED,
            "oneOf": [{"required": ["messages"]}, {"required": ["prompt"]}],
        },
    )
    not_carried = NOT_CARRIED

    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MESSAGES_MAX)
    """Chat messages; exactly one of `messages` and `prompt`."""
    prompt: str | None = Field(default=None, max_length=TEXT_MAX)
    """Plain completion prompt."""

    _record: dict[str, JsonValue] | None = PrivateAttr(default=None)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """The stored request, as its worker reads it: not validated again (the API
        validated it once, and stored `record()`), and shallow: its top-level fields are
        set, and the nested ones (`messages`, `tools`, `response_format`...) stay the JSON
        they are, which the worker forwards to the engine as it is (`record()`,
        `pipelines.llm.engine_client.request_body`) and does not read."""
        if None in record.values():  # stored before the one shape (it kept nulls)
            return cls.model_validate(record)
        inp = cls.model_construct(**record)
        inp._record = dict(record)
        return inp

    def record(self) -> dict[str, JsonValue]:
        """The request as the job stores it, and as its engine gets it (with what mmq
        sets): OpenAI's names and shape, defaults filled in, unset fields left out, a
        developer turn as the system's and a turn's text parts as one text."""
        record = self._record  # read once: a private attribute's read costs microseconds
        if record is None:
            dumped = self.model_dump(
                mode="json", by_alias=True, exclude_none=True, include=set(RECORDED)
            )
            for turn in dumped.get("messages") or []:
                _as_sent(turn)
            self._record = record = dumped
        return record

    @model_validator(mode="after")
    def _one_prompt(self) -> LlmInput:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        if self.messages is None and (self.tools or self.tool_choice or self.response_format):
            raise ValueError("tools, tool_choice and response_format are for chat (messages)")
        return self

    def texts(self) -> list[str]:
        """The prompt's text, tool definitions and calls included."""
        tools = [t.model_dump_json(exclude_none=True) for t in self.tools or []]
        if self.messages is not None:
            return [m.text() for m in self.messages] + tools
        return [self.prompt or ""]

    def needs(self) -> dict[str, Feature]:
        """The request's fields that need an engine feature, by field name."""
        needed: dict[str, Feature] = {}
        if self.tools:
            needed["tools"] = "tools"
        for i, message in enumerate(self.messages or []):
            if message.role == "tool" or message.tool_calls:
                needed.setdefault(f"messages.{i}", "tools")
        if self.tool_choice not in (None, "auto"):
            needed["tool_choice"] = "tool_choice"
        if self.parallel_tool_calls is False:
            needed["parallel_tool_calls"] = "tool_choice"
        if self.response_format is not None and self.response_format.type != "text":
            needed["response_format"] = "response_format"
        if self.logprobs:
            needed["logprobs"] = "logprobs"
        if self.n > 1:
            needed["n"] = "n"
        if self.presence_penalty:
            needed["presence_penalty"] = "presence_penalty"
        for field, _ in self.image_urls():
            needed.setdefault(field, "images")
        if self.stop:
            needed["stop"] = "stop"
        return needed

    def image_urls(self) -> list[tuple[str, str]]:
        """(field, URL) of every image part."""
        return [
            (f"messages.{i}.content.{j}.image_url.url", url)
            for i, message in enumerate(self.messages or [])
            for j, url in message.images()
        ]

    def file_refs(self) -> list[tuple[str, str]]:
        """The image parts that name a file (not a data URL): the API checks them at
        submit, as it checks the file fields of other kinds, and the worker fetches them."""
        return [(field, url) for field, url in self.image_urls() if not DATA_URL.match(url)]

    def check_pipeline(self, config: PipelineConfig) -> None:
        """A field the pipeline's engine would drop is refused by name."""
        options = config.options_as(LlmOptions)
        honoured = engine_features(options)
        if options.engine == "vllm" and self.n > 1 and self.temperature == 0:
            raise InputError(
                "n", "n > 1 needs a temperature above 0 (vLLM samples greedily at 0: one choice)"
            )
        for field, feature in self.needs().items():
            if feature not in honoured:
                raise InputError(
                    field,
                    f"the {config.kind} pipeline's engine ({options.engine}) does not support "
                    f"{FEATURE_NAMES[feature]}",
                )
            if feature == "tools" and not renders_tools(config):
                raise InputError(
                    field,
                    f"the {config.kind} pipeline's model{_named(config)} has a chat template "
                    "that does not render tools (`takes_tools` in its options says otherwise)",
                )
            if feature == "images" and not takes_images(config):
                raise InputError(
                    field,
                    f"the {config.kind} pipeline's model{_named(config)} takes no images "
                    "(a vision-language model does; `takes_images` in its options says so)",
                )

    def prompt_chars(self) -> int:
        return sum(len(text) for text in self.texts())

    def cost(self) -> int:
        """Tokens: the prompt's, estimated from its characters, and `max_tokens` for each
        choice, as OpenAI's rate limiter counts a request when it is admitted."""
        return count_tokens(self.texts(), None) + self.max_tokens * self.n

    def check_limits(self, limits: Limits) -> None:
        for i, message in enumerate(self.messages or []):
            for j, _ in message.audio_parts():
                raise InputError(
                    f"messages.{i}.content.{j}.input_audio",
                    "speech is transcribed by POST /v1/chat/completions (an asr job); "
                    "a job's input takes text and images",
                )
        if self.max_tokens > limits.llm_max_tokens:
            raise over_limit("max_tokens", self.max_tokens, limits.llm_max_tokens)
        self._check_images(limits)
        chars = self.prompt_chars()
        if chars > limits.llm_max_prompt_chars:
            field = "messages" if self.messages is not None else "prompt"
            raise InputError(
                field, f"{chars} characters is over the limit of {limits.llm_max_prompt_chars}"
            )

    def _check_images(self, limits: Limits) -> None:
        """At most `llm_max_images`; a data URL is an image's, in base64, and together
        they hold at most `llm_max_image_bytes` (413 over: larger ones go by file key or
        URL); an http(s) URL only where `llm_image_urls` allows it."""
        images = self.image_urls()
        if len(images) > limits.llm_max_images:
            raise over_limit("messages", len(images), limits.llm_max_images, "images")
        inline = 0
        for field, url in images:
            if url.startswith("data:"):
                inline += _data_url_bytes(url, field)
                if inline > limits.llm_max_image_bytes:
                    raise TooLarge(
                        field,
                        f"the request's data URLs hold over {limits.llm_max_image_bytes} "
                        "bytes of images: send larger ones as stored file keys or URLs",
                    )
            elif url.startswith(("http://", "https://")) and not limits.llm_image_urls:
                raise InputError(
                    field, "image URLs are not fetched here: send a data URL or a file key"
                )

    def prompt_tokens(self, config: PipelineConfig) -> int:
        """The prompt's length in tokens, as estimated before it runs."""
        options = config.options_as(LlmOptions)
        return count_tokens(self.texts(), options.tokenizer or config.model or None)

    def route(self, pipeline: str, settings: Settings) -> str:
        """Prompts over `long_prompt_threshold` tokens go to `long_pipeline`, so that
        short prompts never wait behind them."""
        config = settings.pipelines[pipeline]
        options = config.options_as(LlmOptions)
        long = options.long_pipeline
        if long is None or long not in settings.enabled_pipelines or long == pipeline:
            return pipeline
        adapter = self.model in config.adapters()
        if adapter and self.model not in settings.pipelines[long].adapters():
            return pipeline  # only this engine serves the adapter
        if self.prompt_tokens(config) > options.long_prompt_threshold:
            return long
        return pipeline

    def cache_policy(self, config: PipelineConfig) -> CachePolicy | None:
        """Deterministic requests (temperature 0, cache on) are cached per model and
        parameters; everything but `cache` and the model's alias decides the answer."""
        ttl = config.options_as(LlmOptions).cache_ttl_s
        if not self.cache or self.temperature != 0 or ttl <= 0:
            return None
        # The stored request: the API (at submit) and the worker (at the end) hash the same.
        undecided = ("cache", "model", "seed")
        decided = {k: v for k, v in self.record().items() if k not in undecided}
        adapter = config.adapters().get(self.model or "")
        decided["model"] = config.model if adapter is None else [config.model, adapter]
        canonical = json.dumps(decided, sort_keys=True, separators=(",", ":"))
        return CachePolicy(hashlib.sha256(canonical.encode()).hexdigest(), ttl)


RECORDED = frozenset(LlmInput.model_fields)
"""The job input's own fields: what a route's request adds (streaming...) is not stored."""


def _as_sent(turn: dict[str, JsonValue]) -> None:
    """A dumped turn as the engine takes it, in place: a developer turn is the system's
    (chat templates know `system`), and text parts alone are one text."""
    if turn.get("role") == "developer":
        turn["role"] = "system"
    content = turn.get("content")
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" for part in content
    ):
        turn["content"] = "".join(str(part.get("text") or "") for part in content)  # type: ignore[union-attr]


def _named(config: PipelineConfig) -> str:
    """` (its name)` where clients may see it, else nothing (a path on the host)."""
    model = config.public_model()
    return f" ({model})" if model else ""


def engine_features(options: LlmOptions) -> frozenset[Feature]:
    """What the pipeline's engine honours: its declaration, else its engine's own."""
    if options.engine_features is not None:
        return frozenset(options.engine_features)
    return ENGINE_FEATURES[options.engine]


def takes_images(config: PipelineConfig) -> bool:
    """Whether the pipeline's model reads images: its `takes_images` option, else its
    config.json (a local model directory with a `vision_config`)."""
    options = config.options_as(LlmOptions)
    if options.takes_images is not None:
        return options.takes_images
    return _has_vision_config(config.model or "")


def renders_tools(config: PipelineConfig) -> bool:
    """Whether the pipeline's model sees the tools it is given: its `takes_tools` option,
    else whether its chat template (in a local model directory) renders `tools`. A model
    that is not a local directory is taken at its word: its engine renders its template."""
    options = config.options_as(LlmOptions)
    if options.takes_tools is not None:
        return options.takes_tools
    template = _chat_template(config.model or "")
    return template is None or "tools" in template


@functools.cache
def _chat_template(model: str) -> str | None:
    """The chat template of a local model directory; None where there is none to read."""
    folder = Path(model)
    try:
        return (folder / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: [{"name": …, "template": …}]
        return "".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None


@functools.cache
def _has_vision_config(model: str) -> bool:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config


def _data_url_bytes(url: str, field: str) -> int:
    """The decoded size of an image's data URL; an `InputError` for another data URL."""
    head = DATA_URL.match(url)
    if head is None:
        raise InputError(field, "a data URL must be data:image/(png|jpeg|gif|webp);base64,…")
    try:
        return len(base64.b64decode(url[head.end() :], validate=True))
    except ValueError:
        raise InputError(field, "the data URL's base64 does not decode") from None
