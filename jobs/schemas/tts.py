"""TTS (text to speech) job input."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from jobs.errors import InputError
from jobs.schemas.base import JobInput, over_limit
from jobs.settings import Limits

AudioFormat = Literal["wav", "flac", "mp3", "opus", "pcm"]


class TtsInput(JobInput):
    text: str = Field(min_length=1, max_length=100_000)
    voice: str | None = Field(default=None, max_length=256)
    """A voice the deployment allows; unset: the pipeline's default voice."""
    format: AudioFormat = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    sample_rate: int | None = Field(default=None, ge=8000, le=48000)
    language: str | None = Field(default=None, max_length=16)
    reference_audio: str | None = Field(default=None, max_length=4096)
    """Stored file key of a reference clip (voice cloning engines)."""

    def check_limits(self, limits: Limits) -> None:
        if not self.text.strip():
            raise InputError("text", "must not be blank")
        if len(self.text) > limits.text_max_chars:
            raise over_limit("text", len(self.text), limits.text_max_chars, "characters")
