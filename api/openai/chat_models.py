"""The requests of `POST /v1/chat/completions` and `POST /v1/completions`, as OpenAI's
clients send them.

A chat request is the `llm` job's input (`jobs.schemas.llm.LlmInput`, OpenAI's chat body)
with what is the route's own (streaming, a spoken answer): validated once, here, and
stored as the job's input (`LlmInput.record()`). A completion request shares its sampling
fields with it and becomes its input without a second validation. Every field of
OpenAI's requests is either carried into the job (and so to the engine) or refused with
a 422 that names it and says why (`jobs.schemas.chat.NOT_CARRIED`, the rule of
`jobs.schemas.requests.OpenAIBaseModel`); so is a field OpenAI does not define, a message
role, a content part or a message field mmq does not carry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from api.openai.protocol import CLOSED, OpenAIBaseModel, OpenAIRequest
from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX
from jobs.schemas.chat import (
    MESSAGES_MAX,
    NOT_CARRIED,
    TEXT_MAX,
    ChatMessage,
    ContentPart,
    InputAudio,
    Sampling,
)
from jobs.schemas.llm import LlmInput

__all__ = ["ChatRequest", "CompletionRequest", "ContentPart", "InputAudio"]


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False


class AudioOutput(OpenAIBaseModel):
    """`audio` of a request whose `modalities` ask for audio: the answer spoken by a TTS
    job for each sentence as the LLM writes it (`api.openai.chat_audio`)."""

    voice: str = Field(min_length=1, max_length=256)
    """A voice of the TTS pipeline or one of its aliases (`alloy`...)."""
    format: Literal["wav", "pcm16", "mp3", "flac", "opus", "aac"]
    """`wav` or `pcm16` (24 kHz PCM16 mono, the only format of a streamed answer, as
    OpenAI's); the others are refused by name."""


class Streamed(BaseModel):
    """What chat and completion requests share beside the job's input: streaming."""

    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def llm_input(self) -> LlmInput:
        """The `llm` job's input."""
        raise NotImplementedError

    def job_input(self) -> dict[str, JsonValue]:
        """The `llm` job's input as it is stored."""
        return dict(self.llm_input().record())


class ChatRequest(LlmInput, Streamed):
    """`POST /v1/chat/completions`'s body: the `llm` job's input (`LlmInput`, OpenAI's chat
    body, validated here once and stored as `record()`), and what is the route's own:
    streaming, and the answer spoken too."""

    model_config = ConfigDict(json_schema_extra=CLOSED)

    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessage] = Field(min_length=1, max_length=MESSAGES_MAX)
    prompt: SkipJsonSchema[None] = None
    """Not a chat request's (`POST /v1/completions` takes a prompt)."""
    max_completion_tokens: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    """OpenAI's newer name of `max_tokens` (it wins where both are given)."""
    modalities: list[Literal["text", "audio"]] | None = Field(default=None, min_length=1)
    """`["text", "audio"]`: the answer spoken too (with `audio`)."""
    audio: AudioOutput | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_completion_tokens(cls, data: Any) -> Any:
        """`max_completion_tokens` is the job's `max_tokens` (checked as its own field)."""
        if isinstance(data, dict):
            tokens = data.get("max_completion_tokens")
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1:
                return {**data, "max_tokens": tokens}
        return data

    def refuse_values(self, where: str) -> None:
        if not self.speaks:
            if self.audio is not None:
                raise InputError("audio", 'needs modalities ["text", "audio"]')
            return
        if self.audio is None:
            raise InputError("audio", "an answer with audio needs its voice and format")
        if self.audio.format not in ("wav", "pcm16"):
            raise InputError("audio.format", "wav and pcm16 are served")
        if self.stream and self.audio.format != "pcm16":
            raise InputError("audio.format", "a streamed answer with audio is pcm16")
        if self.n != 1:
            raise InputError("n", "an answer with audio has one choice")

    @property
    def speaks(self) -> bool:
        """Whether the answer is spoken too."""
        return self.modalities is not None and "audio" in self.modalities

    def audio_parts(self) -> list[tuple[str, InputAudio]]:
        """(field, audio) of each `input_audio` part."""
        return [
            (f"messages.{i}.content.{j}.input_audio", audio)
            for i, message in enumerate(self.messages)
            for j, audio in message.audio_parts()
        ]

    def llm_input(self) -> LlmInput:
        """The `llm` job's input: this request, validated once (`record()` leaves out
        what is the route's)."""
        return self


class CompletionRequest(OpenAIRequest, Sampling, Streamed):
    """`POST /v1/completions`'s body: its sampling is the job input's own
    (`jobs.schemas.chat.Sampling`); its prompt and log probabilities are the completions
    API's, which its job input says as chat does."""

    not_carried = NOT_CARRIED

    model: str = Field(min_length=1, max_length=256)
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    """The completions API's: log probabilities of this many most likely tokens as well."""

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("give one prompt (a list of several is not served)")
        return prompt

    def llm_input(self) -> LlmInput:
        """The `llm` job's input, built from this request without validating it again."""
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        if len(prompt) > TEXT_MAX:
            raise InputError("prompt", f"{len(prompt)} characters is over {TEXT_MAX}")
        values = {name: getattr(self, name) for name in Sampling.model_fields}
        if self.logprobs is not None:
            values |= {"logprobs": True, "top_logprobs": self.logprobs}
        return LlmInput.model_construct(model=self.model, prompt=prompt, **values)
