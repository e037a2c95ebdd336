"""The requests of `POST /v1/chat/completions` and `POST /v1/completions`, as OpenAI's
clients send them, and the `llm` job input each one becomes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def as_input(self) -> dict[str, str]:
        role = "system" if self.role == "developer" else self.role
        content = self.content
        text = content if isinstance(content, str) else "".join(p.text for p in content)
        return {"role": role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class Sampling(BaseModel):
    """What chat and completion requests share. Unknown fields are ignored, as OpenAI
    clients send many; `n` must be 1."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache: bool = True
    """mmq extension: answer a deterministic request from the response cache."""

    def sampling_input(self) -> dict[str, Any]:
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
            "cache": self.cache,
        }
        return {k: v for k, v in values.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def job_input(self) -> dict[str, Any]:
        values = self.sampling_input()
        if self.max_completion_tokens is not None:
            values["max_tokens"] = self.max_completion_tokens
        return {**values, "messages": [m.as_input() for m in self.messages]}


class CompletionRequest(Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("give one prompt (a list of several is not served)")
        return prompt

    def job_input(self) -> dict[str, Any]:
        prompt = self.prompt if isinstance(self.prompt, str) else self.prompt[0]
        return {**self.sampling_input(), "prompt": prompt}
