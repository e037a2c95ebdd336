"""A session's configuration in OpenAI's Realtime shape (`session.update`, the `session` of a
client secret), validated: what mmq serves is taken, what it cannot honour is refused by name
(an `error` event whose `param` names the field), and what changes nothing here (tracing,
truncation) is accepted and ignored, as OpenAI's own server ignores what a model lacks."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator

from jobs.errors import InputError
from jobs.schemas import validation_error_field

SessionType = Literal["realtime", "transcription"]
Modality = Literal["text", "audio"]
PCM_RATE: Literal[24000] = 24_000
"""The only input and output rate: OpenAI's `audio/pcm` is 24 kHz mono PCM16."""


class _Open(BaseModel):
    """Fields mmq does not know are refused (each named in the error)."""

    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Open):
    type: Literal["audio/pcm"] = "audio/pcm"
    """PCM16 mono, little-endian (G.711 `audio/pcmu` and `audio/pcma` are not served)."""
    rate: Literal[24000] = PCM_RATE


class ServerVad(_Open):
    """`server_vad`: silero's voice activity model on the session's audio (`realtime.vad`)."""

    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(default=300, ge=0, le=5000)
    silence_duration_ms: int = Field(default=500, ge=100, le=10_000)
    create_response: bool = True
    """A turn that ends makes a response (false: the client sends `response.create`)."""
    interrupt_response: bool = True
    """Speech that starts during a response cancels it (barge-in)."""
    idle_timeout_ms: None = None
    """Not served: the session never speaks first."""


class Transcription(_Open):
    model: str | None = Field(default=None, max_length=256)
    """An ASR model of this deployment (`whisper-1`...); unset: `realtime.asr_model`."""
    language: str | None = Field(default=None, pattern=r"^[a-z]{2,3}$")
    prompt: str | None = Field(default=None, max_length=2000)


class AudioInput(_Open):
    format: AudioFormat = Field(default_factory=AudioFormat)
    transcription: Transcription | None = None
    """Unset in a conversation: the turn is still transcribed (the LLM needs the text),
    but no transcription events are sent."""
    turn_detection: ServerVad | None = Field(default_factory=ServerVad)
    """None: the client commits each turn itself (`input_audio_buffer.commit`)."""
    noise_reduction: None = None
    """Not served."""


class AudioOutput(_Open):
    format: AudioFormat = Field(default_factory=AudioFormat)
    voice: str | None = Field(default=None, min_length=1, max_length=256)
    """A voice of the TTS pipeline or one of its aliases (`alloy`...); unset: its default."""
    speed: float = Field(default=1.0, ge=0.25, le=4.0)


class Audio(_Open):
    input: AudioInput = Field(default_factory=AudioInput)
    output: AudioOutput = Field(default_factory=AudioOutput)


class FunctionTool(_Open):
    type: Literal["function"] = "function"
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=100_000)
    parameters: dict[str, JsonValue] | None = None


class NamedFunction(_Open):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


ToolChoice = Literal["auto", "none", "required"] | NamedFunction
MaxTokens = Annotated[int, Field(ge=1, le=100_000)] | Literal["inf"]


class SessionConfig(_Open):
    """The session as `session.created` and `session.updated` show it."""

    type: SessionType = "realtime"
    model: str | None = Field(default=None, max_length=256)
    """The LLM that answers; unset: `realtime.llm_model`."""
    instructions: str = Field(default="", max_length=100_000)
    output_modalities: list[Modality] = Field(
        default_factory=lambda: list[Modality](["audio"]), min_length=1, max_length=1
    )
    """`audio` (with its transcript) or `text`, as OpenAI takes one of them."""
    audio: Audio = Field(default_factory=Audio)
    tools: list[FunctionTool] = Field(default_factory=list, max_length=128)
    tool_choice: ToolChoice = "auto"
    max_output_tokens: MaxTokens = "inf"
    include: list[Literal["item.input_audio_transcription.logprobs"]] | None = None
    tracing: JsonValue = None
    """Accepted and ignored (OpenAI's traces are its dashboard's)."""
    truncation: JsonValue = None
    """Accepted and ignored: a conversation longer than the model's context fails its turn."""

    @model_validator(mode="after")
    def _transcription_only(self) -> SessionConfig:
        if self.type == "transcription" and self.tools:
            raise ValueError("a transcription session has no tools")
        return self


OPENAI_TRANSCRIBERS = frozenset(
    {"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-transcribe",
     "gpt-live-transcribe", "gpt-4o-mini-transcribe-2025-12-15", "gpt-realtime-whisper"}
)  # fmt: skip
"""OpenAI's transcription models: each means the session's default ASR model, as on
`/v1/audio/transcriptions`."""
OPENAI_REALTIME_PREFIXES = ("gpt-realtime", "gpt-4o-realtime", "gpt-4o-mini-realtime", "gpt-audio")
"""OpenAI's realtime models (`client.realtime.connect(model="gpt-realtime")`): each means
the session's default LLM."""


def llm_of(config: SessionConfig, default: str | None) -> str | None:
    """The LLM a session's answers come from."""
    model = config.model
    if model is None or model.startswith(OPENAI_REALTIME_PREFIXES):
        return default
    return model


def asr_of(config: SessionConfig, default: str | None) -> str | None:
    """The ASR model that transcribes a session's turns."""
    transcription = config.audio.input.transcription
    model = transcription.model if transcription is not None else None
    return default if model is None or model in OPENAI_TRANSCRIBERS else model


def merged(current: SessionConfig, update: JsonValue, param: str = "session") -> SessionConfig:
    """`current` with the fields that `update` sets replaced (objects merged key by key,
    as `session.update` does); InputError naming the field (under `param`) when the result
    is not valid."""
    if not isinstance(update, dict):
        raise InputError(param, "must be an object")
    base = current.model_dump(mode="json")
    try:
        return SessionConfig.model_validate(_merge(base, update))
    except ValidationError as exc:
        raise validation_error_field(exc, param) from None


def parse(session: JsonValue, param: str = "session") -> SessionConfig:
    """A session object as sent (a client secret's); InputError naming the field."""
    return merged(SessionConfig(), session if session is not None else {}, param)


def _merge(base: dict[str, JsonValue], update: dict[str, JsonValue]) -> dict[str, JsonValue]:
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = _merge(old, value)
        else:
            out[key] = value
    return out
