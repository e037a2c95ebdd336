"""`POST /v1/audio/speech`, OpenAI-compatible: a TTS job whose audio streams back as it is made.

The route submits a `tts` job through the JobService (same queues, limits and auth as
`/v1/jobs`), then follows the job's `partial` events and writes each chunk out as it
comes, so the first bytes leave when the first sentence is ready. How each format
streams:

- `pcm`: raw PCM16 mono, little-endian; 24 kHz unless `sample_rate` says otherwise;
- `wav`: a header with unknown lengths (0xFFFFFFFF, as streaming servers write it), then
  PCM; the job's stored file has the real lengths;
- `mp3`, `flac`, `opus` (Ogg): the bytes of a streaming encoder in the worker, carried by
  the partial events; their concatenation is a playable file.

`stream_format: "sse"` sends the same bytes base64-encoded in `speech.audio.delta` events,
then `speech.audio.done`. Errors before the first audio answer in OpenAI's error format
(422 names the field); a failure later ends the stream early (an `error` event in SSE).
A client that goes away cancels its job.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, JsonValue

from api.auth import Owner
from api.deps import Service, SettingsDep
from api.openai.common import Deadline, ended_badly, failure_response, renamed
from api.openai.protocol import (
    OpenAIRequest,
    OpenAIResponse,
    event_stream,
    responses,
    sse,
)
from api.streaming import prepend, stream_job
from broker.queues import pipeline_for
from jobs.errors import InputError
from jobs.models import Event, EventType, JobCreate
from jobs.schemas import tts
from jobs.schemas.tts import CONTENT_TYPES, AudioFormat, TtsOptions
from jobs.settings import Settings

router = APIRouter(prefix="/v1/audio", tags=["openai"])

OPENAI_PCM_RATE = 24_000
"""OpenAI's `pcm` is 24 kHz; mmq resamples to it unless `sample_rate` is given."""
PARAMS = {"text": "input", "format": "response_format"}
"""Job input fields under another name in OpenAI's request."""


class SpeechRequest(OpenAIRequest):
    """OpenAI's request, with mmq's own options; each field is checked as the `tts` job
    input checks it (`jobs.schemas.tts`)."""

    model: str = Field(min_length=1, max_length=256)
    """A TTS pipeline, its model or one of its aliases (`tts-1`...): the deployment's
    configuration says which (`GET /v1/models` lists them)."""
    input: tts.Text
    """The text: at most `limits.text_max_chars` characters (a deployment setting), with
    at least one letter or digit."""
    voice: Annotated[tts.Voice, Field(min_length=1)]
    """A voice of the pipeline's `options.voices` or one of their aliases (`alloy`...):
    the deployment's configuration says which."""
    instructions: str | None = Field(default=None, json_schema_extra={"maxLength": 0})
    """Refused when it says anything: Piper and Coqui voices take no instructions."""
    response_format: AudioFormat = "mp3"
    speed: tts.Speed = 1.0
    stream_format: Literal["audio", "sse"] = "audio"
    sample_rate: tts.SampleRate | None = None
    """mmq extension: output sample rate (default: the voice's; 24 kHz for `pcm`)."""
    language: tts.Language | None = None
    """mmq extension: language of multilingual voices (XTTS)."""
    reference_audio: tts.ReferenceAudio | None = None
    """mmq extension: stored file key of a reference clip, for voices that clone."""


class SpeechAudioDelta(OpenAIResponse):
    """An event of `stream_format: sse`: more of the audio."""

    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str
    """The next bytes of the audio file, in base64."""


class SpeechAudioDone(OpenAIResponse):
    """The last event of a stream whose audio is whole."""

    type: Literal["speech.audio.done"] = "speech.audio.done"


class SpeechError(OpenAIResponse):
    """The last event of a stream whose job failed after its first audio."""

    type: Literal["error"] = "error"
    error: dict[str, JsonValue]
    """The job's error (`type`, `message`), or its status event where it has none
    (`status`: `canceled`)."""


BINARY = {"schema": {"type": "string", "format": "binary"}}
ANSWERS = responses(
    401, 408, 409, 413, 422, 429, 500, 503,
    ok={
        "description": "The audio as it is synthesized, in `response_format`; with "
        "`stream_format: sse`, server-sent events.",
        "content": {
            **{media: BINARY for media in sorted(set(CONTENT_TYPES.values()))},
            **event_stream(SpeechAudioDelta, SpeechAudioDone, SpeechError),
        },
    },
)  # fmt: skip


@router.post("/speech", response_class=StreamingResponse, response_model=None, responses=ANSWERS)
async def create_speech(
    owner: Owner, body: SpeechRequest, service: Service, settings: SettingsDep, deadline: Deadline
) -> StreamingResponse | JSONResponse:
    """Speech from text, streamed as it is synthesized (OpenAI's audio.speech.create)."""
    if body.instructions:
        raise InputError("instructions", "mmq's Piper and Coqui voices take no instructions")
    job_input = _job_input(settings, body)
    try:
        create = JobCreate(kind="tts", input=job_input, **deadline)
        job, events = await service.submit_following(owner, create)
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    audio = _Frames(body)
    frames = await stream_job(
        service, owner, job.id, audio, join=b"".join, cancel_on_disconnect=True, events=events
    )
    # The first frame decides the answer: an error before any audio is OpenAI's error.
    first = await anext(frames, None)
    if audio.failure is not None:
        return failure_response(str(audio.failure["status"]), audio.failure.get("error"), PARAMS)
    headers = {"X-Job-Id": job.id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if audio.first_chunk is not None:
        headers["X-Sample-Rate"] = str(audio.first_chunk["sample_rate"])
    is_sse = body.stream_format == "sse"
    media = "text/event-stream" if is_sse else CONTENT_TYPES[body.response_format]
    return StreamingResponse(prepend(first, frames), media_type=media, headers=headers)


class Voice(OpenAIResponse):
    """A voice a TTS pipeline serves."""

    id: str
    """Its name: what a request's `voice` says."""
    object: Literal["voice"] = "voice"
    pipeline: str
    """The TTS pipeline that serves it (a request's `model`: it or one of its aliases)."""
    engine: str
    """`piper` or `coqui`."""
    aliases: list[str]
    """Other names a request may use for it (OpenAI's `alloy`...)."""
    default: bool
    """The voice of the pipeline's requests that name none."""


class VoiceList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[Voice]


@router.get("/voices", responses=responses(401))
async def list_voices(owner: Owner, settings: SettingsDep) -> VoiceList:
    """The voices of every TTS pipeline, with their aliases (mmq's own route: OpenAI's API
    lists no voices)."""
    voices = []
    for name, config in settings.enabled_pipelines.items():
        if config.kind != "tts":
            continue
        options = config.options_as(TtsOptions)
        default = options.resolve(None)
        for voice, spec in options.voices.items():
            voices.append(Voice(id=voice, pipeline=name, engine=spec.engine,
                                aliases=spec.aliases, default=voice == default))  # fmt: skip
    return VoiceList(data=voices)


def _job_input(settings: Settings, body: SpeechRequest) -> dict[str, object]:
    """The `tts` job input of an OpenAI request; 422 for an unknown model or voice."""
    try:
        pipeline = pipeline_for(settings, "tts", body.model)
        options = settings.pipelines[pipeline].options_as(TtsOptions)
        voice = options.resolve(body.voice)
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    sample_rate = body.sample_rate
    if sample_rate is None and body.response_format == "pcm":
        sample_rate = OPENAI_PCM_RATE
    extras = {"language": body.language, "reference_audio": body.reference_audio}
    return {
        "model": pipeline,
        "text": body.input,
        "voice": voice,
        "format": body.response_format,
        "speed": body.speed,
        "sample_rate": sample_rate,
        **{k: v for k, v in extras.items() if v is not None},
    }


class _Frames:
    """A job's events as the response body: audio bytes, or SSE events around them. A
    job that fails before any audio makes no frame and leaves its `failure` here."""

    def __init__(self, body: SpeechRequest) -> None:
        self.format: AudioFormat = body.response_format
        self.is_sse = body.stream_format == "sse"
        self.first_chunk: Mapping[str, Any] | None = None
        """The data of the job's first partial event: a chunk of the audio."""
        self.failure: Mapping[str, Any] | None = None

    def __call__(self, event: Event) -> Iterator[bytes]:
        if event.type is EventType.PARTIAL:
            data = _audio_bytes(event.data, self.format, first=self.first_chunk is None)
            self.first_chunk = self.first_chunk or event.data
            if data:
                yield sse(SpeechAudioDelta(audio=_b64(data))) if self.is_sse else data
        elif ended_badly(event):
            if self.first_chunk is None:
                self.failure = event.data
            elif self.is_sse:
                yield sse(SpeechError(error=event.data.get("error") or event.data))
        elif event.ends and self.is_sse:
            yield sse(SpeechAudioDone())


def _audio_bytes(chunk: Mapping[str, Any], fmt: AudioFormat, first: bool) -> bytes:
    if "stream" in chunk:
        return base64.b64decode(str(chunk["stream"]))
    pcm = base64.b64decode(str(chunk["audio"]))
    if fmt == "wav" and first:
        return wav_stream_header(int(str(chunk["sample_rate"]))) + pcm
    return pcm


def wav_stream_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header whose lengths are unknown (0xFFFFFFFF): read to the end."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + (b"data" + struct.pack("<I", unknown))
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
