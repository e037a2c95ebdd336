"""The one small interface behind which the TTS engines (Piper, Coqui) sit.

An engine is one loaded voice. It speaks one sentence at a time and yields mono int16
chunks as soon as it has them: one per sentence for most models, several for models that
stream inside a sentence (XTTS). The pipeline owns everything else: sentence splitting,
cancel, resampling, formats, events.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SpeakOptions:
    """What one request asks of an engine, beyond the sentence."""

    speed: float = 1.0
    language: str | None = None
    reference: Path | None = None
    """A local copy of the request's reference clip (voice cloning)."""


class SpeechEngine(Protocol):
    engine: str
    """`piper` or `coqui`."""
    sample_rate: int
    """Rate of the chunks it yields."""
    native_speed: bool
    """True when it honours `speed` itself; else the pipeline changes the tempo."""
    clones: bool
    """True when it takes a reference clip (`reference_audio`)."""

    def load(self) -> None: ...

    def sentence_limit(self, language: str | None) -> int | None:
        """The longest sentence it takes, in characters; None: no limit of its own."""
        ...

    def speak(self, sentence: str, options: SpeakOptions) -> Iterator[np.ndarray]:
        """Mono int16 chunks of `sentence`, in order, each as soon as it is ready."""
        ...

    def unload(self) -> None: ...


def to_int16(wave: object) -> np.ndarray:
    """A float waveform in [-1, 1] (list, array or tensor) as int16 samples."""
    if hasattr(wave, "detach"):
        wave = wave.detach().cpu().numpy()
    array = np.asarray(wave, dtype=np.float32).reshape(-1)
    return (np.clip(array, -1.0, 1.0) * 32767.0).astype(np.int16)
