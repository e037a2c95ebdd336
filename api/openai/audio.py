"""`POST /v1/audio/transcriptions` and `/v1/audio/translations`, OpenAI-compatible.

The upload is stored through the storage (as `POST /v1/files` would), then an `asr` job
that names its key goes through the JobService: the same queues, batching, limits and
auth as `/v1/jobs`. The route then follows the job's events: without `stream` it answers
once the job has ended (json, text, srt, vtt or verbose_json); with `stream=true` each
decoded segment is a `transcript.text.delta` SSE event, then `transcript.text.done`.
`model` names an ASR pipeline (or alias); `whisper-1`, `gpt-4o-transcribe` and
`gpt-4o-mini-transcribe` mean the default one. A client that goes away before the end
cancels its job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.datastructures import FormData, UploadFile

from api.auth import Owner
from api.deps import Service
from api.forms import multipart_body
from api.openai.answers import failure_body
from api.openai.common import (
    CLOSED,
    SSE_KEEPALIVE,
    Deadline,
    ended_badly,
    job_failure,
    refuse_fields,
    renamed,
    sse,
    wait_for_end,
)
from api.openai.transcripts import ResponseFormat, transcript_response
from api.service import JobService
from api.streaming import stream_job
from api.streams import Batches
from jobs.errors import InputError, MmqError, NotFound, TooLarge
from jobs.models import Event, EventType, Job, JobCreate
from jobs.schemas import asr, validation_error_field
from jobs.settings import Limits

router = APIRouter(prefix="/v1/audio", tags=["openai"])

DEFAULT_MODELS = frozenset({"whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe"})
"""OpenAI's transcription model names: each means "the default ASR pipeline"."""
PARAMS = {
    "audio": "file",
    "initial_prompt": "prompt",
    "word_timestamps": "timestamp_granularities",
    "kind": "model",
}
"""Job input fields under another name in OpenAI's request."""
PENDING_KEY = "pending/uploads/0/audio"
"""Stands in for the upload's key while the rest of the request is validated."""
AUDIO = (
    "The audio (wav, flac, mp3, ogg/opus, m4a, webm: what FFmpeg reads), at most "
    "`limits.audio_max_bytes` (413 above) and `limits.audio_max_seconds` long (the "
    "deployment's settings)."
)
NOT_CARRIED = {
    "include": "log probabilities of a transcript are not served",
    "chunking_strategy": "mmq decodes the whole file (no chunking options)",
    "known_speaker_names": "speaker diarization is not served",
    "known_speaker_references": "speaker diarization is not served",
}
"""OpenAI form fields that mmq does not carry, with why (any other unknown one is refused
too)."""


class TranscriptionForm(BaseModel):
    """The form fields of a transcription or translation request (not the file)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra=CLOSED, use_attribute_docstrings=True
    )

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

    def job_input(self, task: str, audio_key: str) -> dict[str, Any]:
        extras = {"beam_size": self.beam_size, "vad_filter": self.vad_filter}
        return {
            "model": None if self.model in DEFAULT_MODELS else self.model,
            "audio": audio_key,
            "task": task,
            "language": self.language,
            "initial_prompt": self.prompt,
            "temperature": self.temperature,
            "word_timestamps": "word" in self.timestamp_granularities,
            **{k: v for k, v in extras.items() if v is not None},
        }


UPLOAD_BODY = multipart_body(TranscriptionForm, {"file": AUDIO})


@router.post("/transcriptions", responses={413: {}, 422: {}, 429: {}}, openapi_extra=UPLOAD_BODY)
async def create_transcription(
    request: Request, owner: Owner, service: Service, deadline: Deadline
) -> Response:
    """Speech to text in the audio's language (OpenAI's audio.transcriptions.create)."""
    return await _transcribe(request, service, owner, "transcribe", deadline)


@router.post("/translations", responses={413: {}, 422: {}, 429: {}}, openapi_extra=UPLOAD_BODY)
async def create_translation(
    request: Request, owner: Owner, service: Service, deadline: Deadline
) -> Response:
    """Speech to English text (OpenAI's audio.translations.create)."""
    return await _transcribe(request, service, owner, "translate", deadline)


async def _transcribe(
    request: Request, service: JobService, owner: str, task: str, deadline: dict[str, Any]
) -> Response:
    # Parsed here, after the API key is checked, not by FastAPI before it.
    form = await request.form(max_files=1, max_fields=32)
    try:
        fields, upload = _parse(form, service.settings.limits)
        job, followed = await _submit(service, owner, fields, upload, task, deadline)
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    finally:
        await form.close()
    headers = {"X-Job-Id": job.id}
    if fields.stream:
        events = await stream_job(
            service,
            owner,
            job.id,
            _Deltas(),
            keepalive=SSE_KEEPALIVE,
            join=b"".join,
            cancel_on_disconnect=True,
            events=followed,
        )
        headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)
    ended = await wait_for_end(request, service, owner, job.id, followed)
    if ended.status != "succeeded" or ended.output is None:
        return job_failure(ended, PARAMS)
    words = "word" in fields.timestamp_granularities
    return transcript_response(ended.output, fields.response_format, task, words, headers)


def _parse(form: FormData, limits: Limits) -> tuple[TranscriptionForm, UploadFile]:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InputError("file", "send the audio as the multipart/form-data field 'file'")
    limit = limits.audio_max_bytes
    if upload.size is not None and upload.size > limit:
        raise TooLarge("file", f"is {upload.size} bytes, over the limit of {limit} bytes")
    values: dict[str, Any] = {
        k.removesuffix("[]"): v for k, v in form.items() if isinstance(v, str) and k != "file"
    }
    grains = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    values["timestamp_granularities"] = grains
    try:
        fields = TranscriptionForm.model_validate(values)
    except ValidationError as exc:
        raise validation_error_field(exc, "") from None
    refuse_fields(fields.model_extra, NOT_CARRIED)
    return fields, upload


async def _submit(
    service: JobService,
    owner: str,
    fields: TranscriptionForm,
    upload: UploadFile,
    task: str,
    deadline: dict[str, Any],
) -> tuple[Job, Batches]:
    """Check the request, store the upload, submit the job naming it; returns the job and
    its events (`JobService.submit_following`)."""
    service.validate(JobCreate(kind="asr", input=fields.job_input(task, PENDING_KEY)))
    stored = await service.files.upload(owner, upload)
    body = JobCreate(kind="asr", input=fields.job_input(task, stored.key), **deadline)
    try:
        return await service.submit_following(owner, body)
    except MmqError:
        with contextlib.suppress(NotFound):
            await service.files.delete(stored.key)
        raise


class _Deltas:
    """SSE: a delta per segment as the worker decodes it, then done (or an error)."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, event: Event) -> Iterator[bytes]:
        if event.type is EventType.PARTIAL:
            delta = str(event.data["segment"]["text"])
            delta = delta if self.started else delta.lstrip()
            self.started = True
            yield sse({"type": "transcript.text.delta", "delta": delta})
        elif event.type is EventType.OUTPUT:
            yield sse({"type": "transcript.text.done", "text": event.data.get("text", "")})
        elif ended_badly(event):
            yield sse(failure_body(str(event.data["status"]), event.data.get("error"), PARAMS))
