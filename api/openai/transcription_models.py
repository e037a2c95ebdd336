"""The form of `POST /v1/audio/transcriptions` and `/v1/audio/translations` (its text
fields; the file is read beside it), the `asr` job input it becomes, and its answers:
`json`, `verbose_json`, and the events of a stream."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from api.openai.protocol import OpenAIRequest, OpenAIResponse, omitted
from jobs.schemas import asr

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
DEFAULT_MODELS = frozenset({"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"})
"""OpenAI's transcription model names: each means "the default ASR pipeline"."""
NOT_CARRIED = {
    "include": "log probabilities of a transcript are not served",
    "chunking_strategy": "mmq decodes the whole file (no chunking options)",
    "known_speaker_names": "speaker diarization is not served",
    "known_speaker_references": "speaker diarization is not served",
}
"""OpenAI form fields that mmq does not carry, with why (any other unknown one is refused
too)."""


class TranscriptionForm(OpenAIRequest):
    """The form fields of a transcription or translation request (not the file)."""

    not_carried = NOT_CARRIED

    model: str = Field(min_length=1, max_length=256)
    """An ASR pipeline, its model or one of its aliases: the deployment's configuration
    says which (`GET /v1/models` lists them); OpenAI's names (`whisper-1`...): the default one."""
    language: asr.Language | None = None
    """ISO 639-1 code of the audio's language; unset (or blank): detected."""
    prompt: asr.Prompt | None = None
    """Text the decoding starts from (names, spelling)."""
    response_format: ResponseFormat = "json"
    temperature: asr.Temperature = 0.0
    timestamp_granularities: list[Literal["word", "segment"]] = Field(
        default_factory=list, max_length=2
    )
    """`word`: each word's timestamps too (in `verbose_json`). Sent as
    `timestamp_granularities[]`, as OpenAI's client does, or without the brackets."""
    stream: bool = False
    beam_size: asr.BeamSize | None = None
    """mmq extension: beam width (default 5)."""
    vad_filter: bool | None = None
    """mmq extension: skip silence with Silero VAD before decoding."""

    @field_validator("language", "prompt", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @property
    def words(self) -> bool:
        return "word" in self.timestamp_granularities

    def job_input(self, task: str, audio_key: str) -> dict[str, object]:
        extras = {"beam_size": self.beam_size, "vad_filter": self.vad_filter}
        return {
            "model": None if self.model in DEFAULT_MODELS else self.model,
            "audio": audio_key,
            "task": task,
            "language": self.language,
            "initial_prompt": self.prompt,
            "temperature": self.temperature,
            "word_timestamps": self.words,
            **{k: v for k, v in extras.items() if v is not None},
        }


class TranscriptionUsage(OpenAIResponse):
    type: Literal["duration"] = "duration"
    seconds: float
    """The audio's length."""


class Transcription(OpenAIResponse):
    """`response_format: json`."""

    text: str
    usage: TranscriptionUsage


class TranscriptionSegment(OpenAIResponse):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0


class TranscriptionWord(OpenAIResponse):
    word: str
    start: float
    end: float


class TranscriptionVerbose(OpenAIResponse):
    """`response_format: verbose_json`."""

    task: Literal["transcribe", "translate"]
    language: str
    """Its code (`en`): the request's, or the one detected."""
    duration: float
    text: str
    segments: list[TranscriptionSegment]
    words: list[TranscriptionWord] | None = omitted()
    """With `timestamp_granularities[]=word`."""
    usage: TranscriptionUsage


class TranscriptTextDelta(OpenAIResponse):
    """A stream's event: the text of a segment as it is decoded."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TranscriptTextDone(OpenAIResponse):
    """A stream's last event: the whole text."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
