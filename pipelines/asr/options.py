"""A request's decoding options, and faster-whisper's defaults for everything else."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields, replace
from typing import Any

from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import TranscriptionOptions, get_suppressed_tokens

from jobs.schemas.asr import AsrInput

FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Temperature 0 means: greedy/beam first, then sample hotter while a window fails
(too repetitive or too unlikely), as Whisper and OpenAI's API do."""


@dataclass(frozen=True)
class DecodeOptions:
    """What a request may choose; the rest is faster-whisper's `transcribe` default."""

    language: str | None = None
    """None: detected from the first window (English-only models: always en)."""
    task: str = "transcribe"
    beam_size: int = 5
    temperatures: tuple[float, ...] = FALLBACK_TEMPERATURES
    initial_prompt: str | None = None
    word_timestamps: bool = False
    vad_filter: bool = False

    @classmethod
    def from_input(cls, request: AsrInput) -> DecodeOptions:
        temperatures = FALLBACK_TEMPERATURES if request.temperature == 0 else (request.temperature,)
        return cls(
            language=request.language,
            task=request.task,
            beam_size=request.beam_size,
            temperatures=temperatures,
            initial_prompt=request.initial_prompt or None,
            word_timestamps=request.word_timestamps,
            vad_filter=request.vad_filter,
        )

    def batch_key(self) -> tuple[str, int, tuple[float, ...]]:
        """Options that must be equal inside one generate call; language, task, prompt
        and VAD are per window, so requests that differ only in them still batch."""
        return ("asr", self.beam_size, self.temperatures)

    def with_language(self, language: str) -> DecodeOptions:
        return replace(self, language=language)


# Values of every type: whatever faster-whisper's signature says.
TRANSCRIBE_DEFAULTS: dict[str, Any] = {
    name: param.default
    for name, param in inspect.signature(WhisperModel.transcribe).parameters.items()
    if param.default is not inspect.Parameter.empty
}
"""`WhisperModel.transcribe`'s defaults: what a request does not choose."""


def transcription_options(options: DecodeOptions, tokenizer: Tokenizer) -> TranscriptionOptions:
    """faster-whisper's options for one file: `transcribe`'s defaults and the request's."""
    names = {f.name for f in fields(TranscriptionOptions)}
    values = {k: v for k, v in TRANSCRIBE_DEFAULTS.items() if k in names}
    values.update(
        beam_size=options.beam_size,
        temperatures=list(options.temperatures),
        initial_prompt=options.initial_prompt,
        word_timestamps=options.word_timestamps,
        suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
        without_timestamps=False,
        multilingual=False,
        hallucination_silence_threshold=None,
    )
    return TranscriptionOptions(**values)
