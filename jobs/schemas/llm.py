"""LLM (chat or completion) job input."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.errors import InputError
from jobs.schemas.base import JobInput, over_limit
from jobs.settings import Limits


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)


class LlmInput(JobInput):
    messages: list[ChatMessage] | None = Field(default=None, max_length=1000)
    """Chat messages; exactly one of `messages` and `prompt`."""
    prompt: str | None = Field(default=None, max_length=1_000_000)
    """Plain completion prompt."""
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] | None = Field(default=None, max_length=4)
    seed: int | None = None
    cache: bool = True
    """Answer a deterministic request (temperature 0) from the response cache."""

    @model_validator(mode="after")
    def _one_prompt(self) -> LlmInput:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self

    def prompt_chars(self) -> int:
        if self.messages is not None:
            return sum(len(m.content) for m in self.messages)
        return len(self.prompt or "")

    def check_limits(self, limits: Limits) -> None:
        if self.max_tokens > limits.llm_max_tokens:
            raise over_limit("max_tokens", self.max_tokens, limits.llm_max_tokens)
        chars = self.prompt_chars()
        if chars > limits.llm_max_prompt_chars:
            field = "messages" if self.messages is not None else "prompt"
            raise InputError(
                field, f"{chars} characters is over the limit of {limits.llm_max_prompt_chars}"
            )
