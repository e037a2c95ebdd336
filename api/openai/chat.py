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
    """Every model the deployment serves, all kinds: pipeline names, models (by hub id;
    a model loaded from a path is listed by its pipeline's name), aliases, LoRA
    adapters."""
    seen: dict[str, dict[str, Any]] = {}
    for name, config in settings.enabled_pipelines.items():
        model = config.public_model()
        for model_id in (name, model, *config.aliases, *config.adapters()):
            if model_id and model_id not in seen:
                seen[model_id] = {
                    "id": model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "mmq",
                    "kind": config.kind,
                    "pipeline": name,
                }
                if model_id in config.adapters():  # a LoRA adapter, as vLLM lists one
                    seen[model_id]["parent"] = model or name
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
        job, events = await service.submit_following(owner, create)
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
            events=events,
        )
        headers |= {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)
    ended = await wait_for_end(request, service, owner, job.id, events)
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

    def chunk(
        self,
        text: str | None,
        reason: str | None = None,
        *,
        role: bool = False,
        index: int = 0,
        calls: list[dict[str, Any]] | None = None,
        logprobs: Any = None,
    ) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
            if logprobs is not None:
                choice["logprobs"] = {"content": logprobs}
            return sse({**self._head("chat.completion.chunk"), "choices": [choice]})
        choice = {"index": index, "text": text or "", "finish_reason": reason, "logprobs": logprobs}
        return sse({**self._head("text_completion"), "choices": [choice]})

    def usage_chunk(self, usage: dict[str, Any] | None) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return sse({**self._head(obj), "choices": [], "usage": usage})

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


class _Chunks:
    """A job's events as SSE chunks: the role first (chat, for each choice), a delta per
    partial event (its choice's `index`, text, tool call deltas and log probabilities),
    each choice's finish reason, usage where asked for, an error if the job did not
    succeed, and `[DONE]` at the end."""

    def __init__(self, view: _View, include_usage: bool) -> None:
        self.view = view
        self.include_usage = include_usage
        self.started: set[int] = set()

    def __call__(self, event: Event) -> Iterator[bytes]:
        view = self.view
        yield from self._role(0)
        if event.type is EventType.PARTIAL:
            data = event.data
            index = data.get("choice", 0)
            yield from self._role(index)
            yield view.chunk(
                str(data.get("text", "")),
                index=index,
                calls=data.get("tool_calls"),
                logprobs=data.get("logprobs"),
            )
        elif event.type is EventType.OUTPUT:
            outs = answers.choices_of(event.data)
            for out in outs:
                index = out.get("index", 0)
                yield from self._role(index)
                if event.data.get("cached"):  # no partial events: each choice whole at once
                    calls = [{"index": i, **c} for i, c in enumerate(out.get("tool_calls") or [])]
                    logprobs = out.get("logprobs")
                    if view.chat and logprobs is not None:
                        logprobs = logprobs.get("content")
                    yield view.chunk(
                        str(out.get("text", "")), index=index, calls=calls, logprobs=logprobs
                    )
            for out in outs:
                yield view.chunk(None, reason=out.get("finish_reason"), index=out.get("index", 0))
            if self.include_usage:
                yield view.usage_chunk(event.data.get("usage"))
        elif ended_badly(event):
            status = str(event.data["status"])
            yield sse(failure_body(status, event.data.get("error"), PARAMS))
        if event.ends:
            yield b"data: [DONE]\n\n"

    def _role(self, index: int) -> Iterator[bytes]:
        """A chat choice's first chunk names its role."""
        if index not in self.started:
            self.started.add(index)
            if self.view.chat:
                yield self.view.chunk("", role=True, index=index)
