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
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from api.auth import Owner
from api.deps import Service
from api.error_handlers import ErrorResponse
from api.event_feed import Batches
from api.forms import multipart_body
from api.openai.answers import failure
from api.openai.common import (
    Deadline,
    DeadlineFields,
    ended_badly,
    job_failure,
    renamed,
    wait_for_end,
)
from api.openai.protocol import SSE_KEEPALIVE, event_stream, responses, sse
from api.openai.transcription_models import (
    Transcription,
    TranscriptionForm,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from api.openai.transcripts import transcript_response
from api.service import JobService
from api.streaming import stream_job
from jobs.errors import InputError, MmqError, NotFound, TooLarge
from jobs.models import Event, EventType, Job, JobCreate
from jobs.schemas import validation_error_field
from jobs.settings import Limits

router = APIRouter(prefix="/v1/audio", tags=["openai"])

Task = Literal["transcribe", "translate"]
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
UPLOAD_BODY = multipart_body(TranscriptionForm, {"file": AUDIO})
TEXT = {"schema": {"type": "string"}}
ANSWERS = responses(
    401, 408, 409, 413, 422, 429, 500, 503,
    ok={
        "description": "`json` or `verbose_json`; `text` and `srt` as text/plain, `vtt` as "
        "text/vtt; with `stream`, server-sent events.",
        "content": {
            "text/plain": TEXT,
            "text/vtt": TEXT,
            **event_stream(TranscriptTextDelta, TranscriptTextDone, ErrorResponse),
        },
    },
)  # fmt: skip


@router.post(
    "/transcriptions",
    response_model=Transcription | TranscriptionVerbose,
    responses=ANSWERS,
    openapi_extra=UPLOAD_BODY,
)
async def create_transcription(
    request: Request, owner: Owner, service: Service, deadline: Deadline
) -> Response:
    """Speech to text in the audio's language (OpenAI's audio.transcriptions.create)."""
    return await _transcribe(request, service, owner, "transcribe", deadline)


@router.post(
    "/translations",
    response_model=Transcription | TranscriptionVerbose,
    responses=ANSWERS,
    openapi_extra=UPLOAD_BODY,
)
async def create_translation(
    request: Request, owner: Owner, service: Service, deadline: Deadline
) -> Response:
    """Speech to English text (OpenAI's audio.translations.create)."""
    return await _transcribe(request, service, owner, "translate", deadline)


async def _transcribe(
    request: Request, service: JobService, owner: str, task: Task, deadline: DeadlineFields
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
    return transcript_response(ended.output, fields.response_format, task, fields.words, headers)


def _parse(form: FormData, limits: Limits) -> tuple[TranscriptionForm, UploadFile]:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InputError("file", "send the audio as the multipart/form-data field 'file'")
    limit = limits.audio_max_bytes
    if upload.size is not None and upload.size > limit:
        raise TooLarge("file", f"is {upload.size} bytes, over the limit of {limit} bytes")
    values: dict[str, str | list[str | UploadFile]] = {
        k.removesuffix("[]"): v for k, v in form.items() if isinstance(v, str) and k != "file"
    }
    grains = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    values["timestamp_granularities"] = grains
    try:
        fields = TranscriptionForm.model_validate(values)
    except ValidationError as exc:
        raise validation_error_field(exc, "") from None
    return fields, upload


async def _submit(
    service: JobService,
    owner: str,
    fields: TranscriptionForm,
    upload: UploadFile,
    task: Task,
    deadline: DeadlineFields,
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
            yield sse(TranscriptTextDelta(delta=delta))
        elif event.type is EventType.OUTPUT:
            yield sse(TranscriptTextDone(text=event.data.get("text", "")))
        elif ended_badly(event):
            yield sse(failure(str(event.data["status"]), event.data.get("error"), PARAMS))
