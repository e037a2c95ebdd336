"""ASR (speech to text) job input, and the options of an ASR pipeline."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobs.outputs import JobOutput
from jobs.schemas.base import JobInput

# The constraints of the fields that OpenAI's transcription form carries too
# (`api.openai.audio`): one definition, so that the form validates and publishes what the
# job input does.
Language = Annotated[str, Field(pattern=r"^[a-z]{2,3}$")]
Prompt = Annotated[str, Field(max_length=2000)]
BeamSize = Annotated[int, Field(ge=1, le=10)]
Temperature = Annotated[float, Field(ge=0.0, le=1.0)]


class AsrInput(JobInput):
    audio: str = Field(min_length=1, max_length=4096)
    """The audio: a stored file key of yours, an http(s) URL, or an s3:// URL (a URL must
    reach a public address unless the deployment allows private ones)."""
    language: Language | None = None
    """ISO 639-1 code; unset: detected."""
    task: Literal["transcribe", "translate"] = "transcribe"
    beam_size: BeamSize = 5
    vad_filter: bool = False
    word_timestamps: bool = False
    initial_prompt: Prompt | None = None
    temperature: Temperature = 0.0

    def cost_after(self, output: JobOutput) -> int:
        """Seconds of audio, known once it is decoded: counted when the job succeeds."""
        duration = output.get("duration")
        return math.ceil(duration) if isinstance(duration, int | float) else 0


class AsrOptions(BaseModel):
    """`options` of an ASR pipeline (`[pipelines.NAME.options]`): the faster-whisper model's
    knobs and how long files are windowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    compute_type: str | None = None
    """CTranslate2 compute type (`int8`, `float16`, `int8_float16`...); unset: float16 on
    a GPU, int8 on a CPU."""
    cpu_threads: int = Field(default=0, ge=0)
    """Threads per CTranslate2 call; 0: every core this process may use (a call alone gets
    them all)."""
    num_workers: int = Field(default=1, ge=1)
    """CTranslate2 calls at once: keep it equal to the pipeline's `runners`."""
    device_index: int = Field(default=0, ge=0)
    """The GPU inside the worker; its CUDA_VISIBLE_DEVICES leaves it one, index 0."""
    download_root: str | None = None
    """Where a hub model is downloaded; unset: the hub's cache."""
    first_window_s: float = Field(default=6.0, gt=0)
    """A long file's first window ends near here, for an early first segment."""
    context_tokens: int = Field(default=32, ge=0)
    """Previous-text tokens each window is conditioned on (equal lengths batch together)."""
