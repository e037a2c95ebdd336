"""`POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`,
OpenAI-compatible.

Each request becomes an `llm` job through the JobService (the same queues, admission,
long/short routing, response cache, limits and auth as `/v1/jobs`); the route then
follows the job's events: token deltas as `chat.completion.chunk` (or `text_completion`)
SSE chunks with `stream: true`, else one answer once the job has ended. A client that
goes away cancels its job, which aborts the sequence in the engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.auth import Owner
from api.deps import Service, SettingsDep
from api.openai import answers
from api.openai.answers import failure_body
from api.openai.chat_models import ChatRequest, CompletionRequest
from api.openai.common import (
    SSE_KEEPALIVE,
    Deadline,
    ended_badly,
    job_failure,
    renamed,
    sse,
    wait_for_end,
)
from api.service import JobService
from api.streaming import stream_job
from jobs.errors import InputError
from jobs.models import Event, EventType, Job, JobCreate

router = APIRouter(prefix="/v1", tags=["openai"])

PARAMS: dict[str, str] = {}
"""Job input fields under another name in OpenAI's request (none: the same names)."""


@router.post("/chat/completions", responses={422: {}, 429: {}})
async def create_chat_completion(
    request: Request, owner: Owner, body: ChatRequest, service: Service, deadline: Deadline
) -> Response:
    """A chat completion (OpenAI's chat.completions.create), streamed or not."""
    return await _complete(request, service, owner, body, deadline, chat=True)


@router.post("/completions", responses={422: {}, 429: {}})
async def create_completion(
    request: Request, owner: Owner, body: CompletionRequest, service: Service, deadline: Deadline
) -> Response:
    """A text completion (OpenAI's completions.create), streamed or not."""
    return await _complete(request, service, owner, body, deadline, chat=False)


@router.get("/models")
async def list_models(owner: Owner, settings: SettingsDep) -> dict[str, Any]:
    """Every model the deployment serves, all kinds: pipeline names, models, aliases."""
    seen: dict[str, dict[str, Any]] = {}
    for name, config in settings.enabled_pipelines.items():
        for model_id in (name, config.model, *config.aliases):
            if model_id and model_id not in seen:
                seen[model_id] = {
                    "id": model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "mmq",
                    "kind": config.kind,
                    "pipeline": name,
                }
    return {"object": "list", "data": list(seen.values())}


async def _complete(
    request: Request,
    service: JobService,
    owner: str,
    body: ChatRequest | CompletionRequest,
    deadline: dict[str, Any],
    *,
    chat: bool,
) -> Response:
    try:
        body.refuse_what_is_not_carried()
        create = JobCreate(kind="llm", input=body.job_input(), **deadline)
        job, _ = await service.submit(owner, create)
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    view = _View(job, body.model, chat)
    headers = {"X-Job-Id": job.id}
    if body.stream:
        chunks = await stream_job(
            service,
            owner,
            job.id,
            _Chunks(view, body.include_usage),
            keepalive=SSE_KEEPALIVE,
            join=b"".join,
            cancel_on_disconnect=True,
        )
        headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    ended = await wait_for_end(request, service, owner, job.id)
    if ended.output is None or ended.status != "succeeded":
        return job_failure(ended, PARAMS)
    return JSONResponse(view.whole(ended), headers=headers)


class _View:
    """One job as OpenAI's chat or completion objects."""

    def __init__(self, job: Job, model: str, chat: bool) -> None:
        self.id = answers.completion_id(job.id, chat=chat)
        self.created = int(job.created_at)
        self.model = model
        self.chat = chat

    def whole(self, ended: Job) -> dict[str, Any]:
        return answers.completion(ended, self.model, chat=self.chat)

    def chunk(self, text: str | None, reason: str | None = None, role: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": reason}
            return sse({**self._head("chat.completion.chunk"), "choices": [choice]})
        choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
        return sse({**self._head("text_completion"), "choices": [choice]})

    def usage_chunk(self, usage: dict[str, Any] | None) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": usage})

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


class _Chunks:
    """A job's events as SSE chunks: the role first (chat), a delta per partial event,
    the finish reason, usage where asked for, an error if the job did not succeed, and
    `[DONE]` at the end."""

    def __init__(self, view: _View, include_usage: bool) -> None:
        self.view = view
        self.include_usage = include_usage
        self.started = False

    def __call__(self, event: Event) -> Iterator[bytes]:
        view = self.view
        if not self.started and view.chat:
            yield view.chunk("", role=True)
        self.started = True
        if event.type is EventType.PARTIAL:
            yield view.chunk(str(event.data.get("text", "")))
        elif event.type is EventType.OUTPUT:
            if event.data.get("cached"):  # no partial events: the whole text at once
                yield view.chunk(str(event.data.get("text", "")))
            yield view.chunk(None, reason=event.data.get("finish_reason"))
            if self.include_usage:
                yield view.usage_chunk(event.data.get("usage"))
        elif ended_badly(event):
            status = str(event.data["status"])
            yield sse(failure_body(status, event.data.get("error"), PARAMS))
        if event.ends:
            yield b"data: [DONE]\n\n"
