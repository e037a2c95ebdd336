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
import contextlib
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import current_owner
from api.deps import AppState, get_service, get_state
from api.openai.common import failure_response, renamed, sse
from api.service import JobService
from api.streams import follow
from jobs.errors import Conflict, InputError, NotFound
from jobs.models import Event, EventType, JobCreate
from jobs.queues import pipeline_for
from jobs.schemas.tts import CONTENT_TYPES, AudioFormat, TtsOptions

router = APIRouter(prefix="/v1/audio", tags=["openai"])

Owner = Annotated[str, Depends(current_owner)]
Service = Annotated[JobService, Depends(get_service)]

OPENAI_PCM_RATE = 24_000
"""OpenAI's `pcm` is 24 kHz; mmq resamples to it unless `sample_rate` is given."""
Chunks = AsyncGenerator[dict[str, object] | Event, None]
"""The data of a job's partial events, then its terminal event where it did not succeed."""
PARAMS = {"text": "input", "format": "response_format"}
"""Job input fields under another name in OpenAI's request."""


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    """A TTS pipeline or one of its aliases (`tts-1`...)."""
    input: str = Field(min_length=1)
    """The text; at most `limits.text_max_chars` characters."""
    voice: str = Field(min_length=1, max_length=256)
    """A voice of the pipeline's `options.voices` (or an alias such as `alloy`)."""
    instructions: str | None = Field(default=None, max_length=4096)
    """Accepted for compatibility; Piper and Coqui voices take no instructions."""
    response_format: AudioFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    sample_rate: int | None = Field(default=None, ge=8000, le=48000)
    """mmq extension: output sample rate (default: the voice's; 24 kHz for `pcm`)."""
    language: str | None = Field(default=None, max_length=16)
    """mmq extension: language of multilingual voices (XTTS)."""
    reference_audio: str | None = Field(default=None, max_length=4096)
    """mmq extension: stored file key of a reference clip, for voices that clone."""


@router.post(
    "/speech",
    response_class=StreamingResponse,
    response_model=None,
    responses={200: {"content": {t: {} for t in {*CONTENT_TYPES.values(), "text/event-stream"}}}},
)
async def create_speech(
    request: Request, body: SpeechRequest, owner: Owner, service: Service
) -> StreamingResponse | JSONResponse:
    """Speech from text, streamed as it is synthesized (OpenAI's audio.speech.create)."""
    state = get_state(request)
    job_input = _job_input(state, body)
    try:
        job, _ = await service.submit(owner, JobCreate(kind="tts", input=job_input))
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    events = _audio_events(state, job.id)
    first = await anext(events, None)
    if first is None or isinstance(first, Event):  # the job ended before any audio
        await events.aclose()
        if isinstance(first, Event):
            return failure_response(str(first.data["status"]), first.data.get("error"), PARAMS)
    headers = {"X-Job-Id": job.id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if isinstance(first, dict):
        headers["X-Sample-Rate"] = str(first["sample_rate"])
    is_sse = body.stream_format == "sse"
    media = "text/event-stream" if is_sse else CONTENT_TYPES[body.response_format]
    content = _body(service, owner, job.id, _prepend(first, events), body)
    return StreamingResponse(content, media_type=media, headers=headers)


def _job_input(state: AppState, body: SpeechRequest) -> dict[str, object]:
    """The `tts` job input of an OpenAI request; 422 for an unknown model or voice."""
    try:
        pipeline = pipeline_for(state.settings, "tts", body.model)
        options = state.settings.pipelines[pipeline].options_as(TtsOptions)
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


async def _audio_events(state: AppState, job_id: str) -> Chunks:
    """The data of each partial event of the job, then its terminal event if it did not
    succeed (failed or canceled)."""
    keepalive_s = state.settings.api.keepalive_s
    async for event in follow(state.store, state.hub, job_id, None, keepalive_s):
        if event is None:
            continue
        if event.type is EventType.PARTIAL:
            yield event.data
        elif event.type is EventType.STATUS and event.data.get("status") in {"failed", "canceled"}:
            yield event


async def _prepend(first: dict[str, object] | None, rest: Chunks) -> Chunks:
    try:
        if first is not None:
            yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def _frames(chunks: Chunks, body: SpeechRequest) -> AsyncIterator[bytes]:
    """The response body: audio bytes, or SSE events around them."""
    is_sse = body.stream_format == "sse"
    started = False
    async for chunk in chunks:
        if isinstance(chunk, Event):  # failed or canceled after audio began
            if is_sse:
                yield sse({"type": "error", "error": chunk.data.get("error") or chunk.data})
            return
        data = _audio_bytes(chunk, body.response_format, first=not started)
        started = True
        if data:
            yield sse({"type": "speech.audio.delta", "audio": _b64(data)}) if is_sse else data
    if is_sse:
        yield sse({"type": "speech.audio.done"})


def _audio_bytes(chunk: dict[str, object], fmt: AudioFormat, first: bool) -> bytes:
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


async def _body(
    service: JobService,
    owner: str,
    job_id: str,
    chunks: Chunks,
    body: SpeechRequest,
) -> AsyncIterator[bytes]:
    """The response body; cancels the job when the client leaves before its end."""
    finished = False
    try:
        async for frame in _frames(chunks, body):
            yield frame
        finished = True
    finally:
        # A client that went away cancels this task: shield the clean-up from it.
        with anyio.CancelScope(shield=True):
            await chunks.aclose()
            if not finished:
                with contextlib.suppress(Conflict, NotFound):
                    await service.cancel(owner, job_id)
