"""`POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`,
OpenAI-compatible.

Each request becomes an `llm` job through the JobService (the same queues, admission,
long/short routing, response cache, limits and auth as `/v1/jobs`); the route then
follows the job's events: token deltas as `chat.completion.chunk` (or `text_completion`)
SSE chunks with `stream: true`, else one answer once the job has ended. A client that
goes away cancels its job, which aborts the sequence in the engine.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from api.auth import Owner
from api.deps import Service, SettingsDep, get_state
from api.error_handlers import ErrorResponse, error_response
from api.key_watch import REVOKED_MESSAGE
from api.openai import answers, chat_audio
from api.openai.chat_models import ChatRequest, CompletionRequest
from api.openai.common import (
    Deadline,
    DeadlineFields,
    job_failure,
    renamed,
    wait_for_end,
)
from api.openai.completion_models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
)
from api.openai.completion_stream import ChatChunks, CompletionEvents, TextChunks
from api.openai.protocol import (
    SSE_DONE,
    SSE_KEEPALIVE,
    ModelCard,
    ModelList,
    event_stream,
    json_answer,
    responses,
    sse,
)
from api.service import JobService
from api.streaming import Revocation, stream_job
from jobs.errors import InputError
from jobs.models import JobCreate

router = APIRouter(prefix="/v1", tags=["openai"])

PARAMS: dict[str, str] = {}
"""Job input fields under another name in OpenAI's request (none: the same names)."""
ERRORS = (401, 408, 409, 413, 422, 429, 500, 503)


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    responses=responses(
        *ERRORS, ok={"content": event_stream(ChatCompletionChunk, ErrorResponse, done=True)}
    ),
)
async def create_chat_completion(
    request: Request, owner: Owner, body: ChatRequest, service: Service, deadline: Deadline
) -> Response:
    """A chat completion (OpenAI's chat.completions.create), streamed or not."""
    return await complete(request, service, owner, body, deadline, chat=True)


@router.post(
    "/completions",
    response_model=Completion,
    responses=responses(
        *ERRORS, ok={"content": event_stream(CompletionChunk, ErrorResponse, done=True)}
    ),
)
async def create_completion(
    request: Request, owner: Owner, body: CompletionRequest, service: Service, deadline: Deadline
) -> Response:
    """A text completion (OpenAI's completions.create), streamed or not."""
    return await complete(request, service, owner, body, deadline, chat=False)


@router.get("/models", responses=responses(401))
async def list_models(owner: Owner, settings: SettingsDep) -> ModelList:
    """Every model the deployment serves, all kinds: pipeline names, models (by hub id;
    a model loaded from a path is listed by its pipeline's name), aliases, LoRA
    adapters."""
    seen: dict[str, ModelCard] = {}
    for name, config in settings.enabled_pipelines.items():
        model = config.public_model()
        adapters = config.adapters()
        for model_id in (name, model, *config.aliases, *adapters):
            if model_id and model_id not in seen:
                # A LoRA adapter names its base model, as vLLM lists one.
                parent = (model or name) if model_id in adapters else None
                seen[model_id] = ModelCard(
                    id=model_id, kind=config.kind, pipeline=name, parent=parent, model=model
                )
    return ModelList(data=list(seen.values()))


SSE_REVOKED = sse(error_response("api_key_revoked", REVOKED_MESSAGE)) + SSE_DONE
"""The last frames of a completion stream whose key was revoked."""


async def complete(
    request: Request,
    service: JobService,
    owner: str,
    body: ChatRequest | CompletionRequest,
    deadline: DeadlineFields,
    *,
    chat: bool,
    key_id: str | None = None,
) -> Response:
    """The answer to a chat (`chat`) or text completion request: its job submitted, then
    its stream or its end. These routes' FastAPI functions call it, and so do their plain
    routes (`api.plain_routes`), which serve the requests."""
    if isinstance(body, ChatRequest):  # speech in, and the answer spoken: the voice stages
        body = await chat_audio.transcribed(service, owner, body, request)
        if body.speaks:
            return await chat_audio.spoken_answer(request, service, owner, body)
    try:
        validated = body.llm_input()  # the request as the job's input, validated once
        create = JobCreate(kind="llm", input=validated.record(), **deadline)
        job, events = await service.submit_following(owner, create, validated=validated)
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    headers = {"X-Job-Id": job.id}
    if body.stream:
        view = ChatChunks(job, body.model) if chat else TextChunks(job, body.model)
        chunks = await stream_job(
            service,
            owner,
            job.id,
            CompletionEvents(view, body.include_usage, PARAMS),
            keepalive=SSE_KEEPALIVE,
            join=b"".join,
            cancel_on_disconnect=True,
            events=events,
            revoked=Revocation.of(get_state(request).api_keys.watch, key_id, SSE_REVOKED),
        )
        headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    ended = await wait_for_end(request, service, owner, job.id, events)
    if ended.output is None or ended.status != "succeeded":
        return job_failure(ended, PARAMS)
    whole = (answers.chat_completion if chat else answers.text_completion)(ended, body.model)
    return json_answer(whole, headers)
