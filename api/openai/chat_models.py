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
    "audio": "audio output is not served (use /v1/audio/speech)",
    "modalities": "only text output is served",
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


class ContentPart(OpenAIBaseModel):
    not_carried = NOT_CARRIED

    type: str
    text: str | None = None
    image_url: ImageUrl | None = None
    """An `image_url` part's image: a data URL, a stored file key, an s3:// or an http(s)
    URL."""

    def refuse_values(self, where: str) -> None:
        carried = {"text": self.text, "image_url": self.image_url}
        if self.type not in carried:
            why = f"{self.type} parts are not served by mmq's LLM pipelines (text and images)"
            raise InputError(f"{where}type", why)
        if carried[self.type] is None:
            raise InputError(f"{where}{self.type}", f"a {self.type} part needs its {self.type}")

    def as_input(self) -> dict[str, object]:
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
