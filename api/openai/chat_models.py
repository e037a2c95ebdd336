"""The requests of `POST /v1/chat/completions` and `POST /v1/completions`, as OpenAI's
clients send them, and the `llm` job input each one becomes.

Every field of OpenAI's requests is either carried into the job (and so to the engine)
or refused with a 422 that names it and says why (`NOT_CARRIED`, the rule of
`api.openai.protocol.OpenAIBaseModel`); so is a field OpenAI does not define, a message
role, a content part or a message field mmq does not carry.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from api.openai.protocol import OpenAIBaseModel, OpenAIRequest
from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX
from jobs.schemas.llm import (
    MESSAGES_MAX,
    TEXT_MAX,
    TOOL_CALLS_MAX,
    ChatFeatures,
    ChatMessage,
    ImagePart,
    ImageUrl,
    LlmInput,
    Sampling,
    TextPart,
    ToolCall,
    check_turn,
)

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
not one of the request's own is refused too."""


AudioFormat = Literal["wav", "mp3", "flac", "opus", "ogg", "webm", "m4a"]


class InputAudio(OpenAIBaseModel):
    data: str = Field(min_length=1)
    """The audio, base64: at most `limits.audio_max_bytes` once decoded (413 above)."""
    format: AudioFormat
    """What FFmpeg reads: `wav` and `mp3` as OpenAI takes them, and the other containers
    of `/v1/audio/transcriptions`."""


class ContentPart(OpenAIBaseModel):
    not_carried = NOT_CARRIED

    type: str
    text: str | None = Field(default=None, max_length=TEXT_MAX)
    image_url: ImageUrl | None = None
    """An `image_url` part's image: a data URL, a stored file key, an s3:// or an http(s)
    URL."""
    input_audio: InputAudio | None = None
    """An `input_audio` part's speech: an `asr` job transcribes it, and its transcript is
    the text the LLM reads (`api.openai.chat_audio`)."""

    def refuse_values(self, where: str) -> None:
        carried = {"text": self.text, "image_url": self.image_url, "input_audio": self.input_audio}
        if self.type not in carried:
            why = f"{self.type} parts are not served by mmq's LLM pipelines (text, images, audio)"
            raise InputError(f"{where}type", why)
        if carried[self.type] is None:
            raise InputError(f"{where}{self.type}", f"a {self.type} part needs its {self.type}")

    def as_input(self) -> TextPart | ImagePart:
        """The part as the job input holds it, not validated again (this one was)."""
        if self.type == "input_audio":  # transcribed before the request becomes a job
            raise InputError("messages", "an input_audio part was not transcribed")
        if self.type == "text":
            return TextPart.model_construct(type="text", text=self.text)
        return ImagePart.model_construct(type="image_url", image_url=self.image_url)


class Message(OpenAIBaseModel):
    not_carried = NOT_CARRIED

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = Field(default=None, max_length=TEXT_MAX)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=TOOL_CALLS_MAX)
    """An assistant turn's calls."""
    tool_call_id: str | None = Field(default=None, max_length=256)
    """The call a `tool` turn answers."""

    @model_validator(mode="after")
    def _shape_of_its_role(self) -> Self:
        if self.role != "function":  # refused by name (`refuse_values`)
            check_turn(self.role, self.content, self.tool_calls, self.tool_call_id)
        return self

    def refuse_values(self, where: str) -> None:
        if self.role == "function":
            raise InputError(f"{where}role", "deprecated function turns: send tool turns")

    def as_input(self) -> ChatMessage:
        """The turn as the job input holds it, not validated again (this one was): text
        parts joined into one text, unless there are images; a developer turn is the
        system's."""
        role = "system" if self.role == "developer" else self.role
        content: str | list[TextPart | ImagePart] | None
        if isinstance(self.content, list) and any(p.type == "image_url" for p in self.content):
            content = [part.as_input() for part in self.content]
        elif isinstance(self.content, list):
            content = "".join(p.text or "" for p in self.content)
            if len(content) > TEXT_MAX:
                raise InputError("messages", f"a turn's text is over {TEXT_MAX} characters")
        else:
            content = self.content
        return ChatMessage.model_construct(
            role=role, content=content, tool_calls=self.tool_calls, tool_call_id=self.tool_call_id
        )


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


class LlmRequest(OpenAIRequest, Sampling):
    """What chat and completion requests share: their sampling (`jobs.schemas.llm.Sampling`,
    the job input's own), and streaming. A field the pipeline's engine cannot honour is
    refused at submit (`LlmInput.check_pipeline`)."""

    not_carried = NOT_CARRIED

    model: str = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self) -> dict[str, Any]:
        """The request's sampling fields, as they were validated."""
        return {name: getattr(self, name) for name in Sampling.model_fields}

    def job_input(self) -> dict[str, object]:
        """The `llm` job's input as it is stored (`LlmInput.record()`)."""
        return dict(self.llm_input().record())

    def llm_input(self) -> LlmInput:
        """The `llm` job's input: this request's fields, not validated again."""
        raise NotImplementedError


class ChatRequest(LlmRequest, ChatFeatures):
    messages: list[Message] = Field(min_length=1, max_length=MESSAGES_MAX)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    modalities: list[Literal["text", "audio"]] | None = Field(default=None, min_length=1)
    """`["text", "audio"]`: the answer spoken too (with `audio`)."""
    audio: AudioOutput | None = None

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
            (f"messages.{i}.content.{j}.input_audio", part.input_audio)
            for i, message in enumerate(self.messages)
            if isinstance(message.content, list)
            for j, part in enumerate(message.content)
            if part.input_audio is not None and part.type == "input_audio"
        ]

    def llm_input(self) -> LlmInput:
        values = self.sampling() | {name: getattr(self, name) for name in ChatFeatures.model_fields}
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        messages = [m.as_input() for m in self.messages]
        return LlmInput.model_construct(model=self.model, messages=messages, **values)


class CompletionRequest(LlmRequest):
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
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        if len(prompt) > TEXT_MAX:
            raise InputError("prompt", f"{len(prompt)} characters is over {TEXT_MAX}")
        values = self.sampling()
        if self.logprobs is not None:
            values |= {"logprobs": True, "top_logprobs": self.logprobs}
        return LlmInput.model_construct(model=self.model, prompt=prompt, **values)
