"""The `llm` job's input: OpenAI's chat or completions body (its parts in
`jobs.schemas.chat`), checked against the pipeline that runs it (its options in
`jobs.schemas.llm_options`)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import ConfigDict, Field, JsonValue, PrivateAttr, model_validator

from jobs.errors import InputError, TooLarge
from jobs.schemas.base import CachePolicy, JobInput, over_limit
from jobs.schemas.chat import (
    DATA_URL,
    MESSAGES_MAX,
    NOT_CARRIED,
    TEXT_MAX,
    ChatFeatures,
    ChatMessage,
    Sampling,
)
from jobs.schemas.llm_options import (
    FEATURE_NAMES,
    Feature,
    LlmOptions,
    engine_features,
    renders_tools,
    takes_images,
)
from jobs.schemas.requests import CLOSED, OpenAIRequest
from jobs.settings import Limits, PipelineConfig, Settings
from jobs.tokens import count_tokens


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
    prompt: str | None = Field(default=None, min_length=1, max_length=TEXT_MAX)
    """Plain completion prompt; not empty (an engine would generate `max_tokens` from
    nothing: seconds of work that nobody asked for)."""

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


def _data_url_bytes(url: str, field: str) -> int:
    """The decoded size of an image's data URL; an `InputError` for another data URL."""
    head = DATA_URL.match(url)
    if head is None:
        raise InputError(field, "a data URL must be data:image/(png|jpeg|gif|webp);base64,…")
    try:
        return len(base64.b64decode(url[head.end() :], validate=True))
    except ValueError:
        raise InputError(field, "the data URL's base64 does not decode") from None
