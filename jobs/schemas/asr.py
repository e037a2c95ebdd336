"""ASR (speech to text) job input."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from jobs.schemas.base import JobInput


class AsrInput(JobInput):
    audio: str = Field(min_length=1, max_length=4096)
    """The audio: a stored file key, an http(s) URL, or an s3:// URL."""
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}$")
    """ISO 639-1 code; unset: detected."""
    task: Literal["transcribe", "translate"] = "transcribe"
    beam_size: int = Field(default=5, ge=1, le=10)
    vad_filter: bool = False
    word_timestamps: bool = False
    initial_prompt: str | None = Field(default=None, max_length=2000)
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
