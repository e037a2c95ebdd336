"""The requests of `POST /v1/chat/completions` and `POST /v1/completions`, as OpenAI's
clients send them, and the `llm` job input each one becomes.

Every field of OpenAI's requests is either carried into the job (and so to the engine)
or refused with a 422 that names it and says why (`NOT_CARRIED`, the rule of
`api.openai.protocol.OpenAIBaseModel`); so is a field OpenAI does not define, a message
role, a content part or a message field mmq does not carry.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from api.openai.protocol import OpenAIBaseModel, OpenAIRequest
from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX, SEED_MAX, SEED_MIN
from jobs.schemas.llm import MAX_CHOICES, ChatFeatures, ImageUrl, ToolCall

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
    text: str | None = None
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

    def as_input(self) -> dict[str, object]:
        if self.type == "input_audio":  # transcribed before the request becomes a job
            raise InputError("messages", "an input_audio part was not transcribed")
        if self.type == "text":
            return {"type": "text", "text": self.text}
        assert self.image_url is not None
        return {"type": "image_url", "image_url": self.image_url.model_dump(exclude_none=True)}


class Message(OpenAIBaseModel):
    not_carried = NOT_CARRIED

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant turn's calls."""
    tool_call_id: str | None = None
    """The call a `tool` turn answers."""

    def refuse_values(self, where: str) -> None:
        if self.role == "function":
            raise InputError(f"{where}role", "deprecated function turns: send tool turns")

    def as_input(self) -> dict[str, object]:
        """The turn as the job input takes it: text parts joined into one text, unless
        there are images."""
        role = "system" if self.role == "developer" else self.role
        content: str | list[dict[str, object]] | None
        if isinstance(self.content, list) and any(p.type == "image_url" for p in self.content):
            content = [part.as_input() for part in self.content]
        elif isinstance(self.content, list):
            content = "".join(p.text or "" for p in self.content)
        else:
            content = self.content
        turn: dict[str, object] = {"role": role, "content": content}
        if self.tool_calls is not None:
            turn["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            turn["tool_call_id"] = self.tool_call_id
        return turn


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


class Sampling(OpenAIRequest):
    """What chat and completion requests share. A field the pipeline's engine cannot
    honour is refused at submit (`LlmInput.check_pipeline`)."""

    not_carried = NOT_CARRIED

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache: bool = True
    """mmq extension: answer a deterministic request from the response cache."""

    def sampling_input(self) -> dict[str, object]:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        values = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "stop": stop,
            "seed": self.seed,
            "n": self.n,
            "cache": self.cache,
        }
        return {k: v for k, v in values.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(Sampling, ChatFeatures):
    messages: list[Message] = Field(min_length=1)
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

    def job_input(self) -> dict[str, object]:
        values = self.sampling_input()
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        features = set(ChatFeatures.model_fields)  # the job input's own, as they are
        values |= self.model_dump(include=features, by_alias=True, exclude_none=True)
        return {**values, "messages": [m.as_input() for m in self.messages]}


class CompletionRequest(Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    """The completions API's: log probabilities of this many most likely tokens as well."""

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("give one prompt (a list of several is not served)")
        return prompt

    def job_input(self) -> dict[str, object]:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        values = {**self.sampling_input(), "prompt": prompt}
        if self.logprobs is not None:
            values |= {"logprobs": True, "top_logprobs": self.logprobs}
        return values
