"""OpenAI's Responses API: `POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}`,
`POST /v1/responses/{id}/cancel` and `GET /v1/responses/{id}/input_items`.

A response is an `llm` job (`api.openai.response_models` makes its chat turns): it has
what every job has (queues, priorities from `service_tier`, quotas, fair share, deadlines,
durability, its events and webhooks), and its id names the job (`resp_X` is `job_X`).
Stored (`store`, the default), its record keeps the request and the conversation
(`jobstore.responses`), so that `previous_response_id` continues it from the store.

- not streamed: answered once the job has ended (the job is canceled if the client goes
  away first);
- `stream: true`: the job's events as the Responses events (`api.openai.response_stream`);
- `background: true`: answered at once, `queued`; polled with `GET`, streamed from where
  it is with `GET ...?stream=true&starting_after=N`, canceled with `POST .../cancel`. A
  client that goes away leaves it running.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from api.auth import Owner
from api.deps import Service, StoredResponses
from api.openai.common import Deadline, job_failure, no_frames, renamed, wait_for_end
from api.openai.protocol import (
    SSE_KEEPALIVE,
    OpenAIResponse,
    event_stream,
    json_answer,
    responses,
)
from api.openai.response_models import PARAMS, InputItem, ResponseRequest, chat_turns
from api.openai.response_objects import Response as ResponseObject
from api.openai.response_objects import StreamEvent, job_id_of, response_object, turns_of
from api.openai.response_stream import ResponseEvents
from api.service import JobService, new_job_id
from api.streaming import stream_job
from jobs.errors import InputError, NotFound
from jobs.models import Job, JobCreate
from jobs.states import JobStatus
from jobstore.responses import AsyncResponses, ResponseRecord
from security.echo import clip

router = APIRouter(prefix="/v1/responses", tags=["openai"])

ERRORS = (401, 408, 409, 413, 422, 429, 500, 503)
CANCEL_WAIT_S = 10.0
"""How long a cancel waits for the job to stop (at its next token) before it answers."""
STREAM = event_stream(StreamEvent)
"""The 200's `text/event-stream` of a streamed response."""
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class DeletedResponse(OpenAIResponse):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


@router.post(
    "", response_model=ResponseObject, responses=responses(*ERRORS, ok={"content": STREAM})
)
async def create_response(
    request: Request,
    owner: Owner,
    body: ResponseRequest,
    service: Service,
    stored: StoredResponses,
    deadline: Deadline,
) -> Response:
    """A model response (OpenAI's responses.create): streamed or not, in the background or
    not, stored or not."""
    history = await _history(service, stored, owner, body.previous_response_id)
    items = body.items()
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    job_id = new_job_id()
    record = ResponseRecord(
        owner=owner,
        request=body.model_dump(mode="json", by_alias=True, exclude={"input"}, exclude_none=True),
        input_items=[_listed(item, f"{job_id.removeprefix('job_')}_{i}") for i, item in
                     enumerate(items)],
        history=history,
        created_at=time.time(),
    )  # fmt: skip
    create = JobCreate(
        kind="llm",
        input={**body.job_options(), "messages": system + history + chat_turns(items)},
        priority=body.priority(),  # type: ignore[arg-type]
        metadata=body.metadata or {},
        webhook=body.webhook,
        **deadline,
    )
    if body.store:  # before the job: a response whose job exists has its record
        await stored.save(job_id, record)
    try:
        if body.background and not body.stream:
            job, _ = await service.submit(owner, create, job_id=job_id)
            return json_answer(response_object(job, record), {"X-Job-Id": job.id})
        job, events = await service.submit_following(owner, create, job_id=job_id)
    except Exception as exc:  # refused (422, 413, 429...): no job, so no response either
        if body.store:
            with contextlib.suppress(Exception):
                await stored.delete(owner, job_id)
        if isinstance(exc, InputError):
            raise renamed(exc, PARAMS) from None
        raise
    headers = {"X-Job-Id": job.id}
    if body.stream:
        frames = await stream_job(
            service, owner, job.id, ResponseEvents(job, record), keepalive=SSE_KEEPALIVE,
            join=b"".join, cancel_on_disconnect=not body.background, events=events,
        )  # fmt: skip
        return StreamingResponse(
            frames, media_type="text/event-stream", headers=headers | STREAM_HEADERS
        )
    ended = await wait_for_end(request, service, owner, job.id, events)
    if ended.status is not JobStatus.SUCCEEDED:
        return job_failure(ended, PARAMS)
    return json_answer(response_object(ended, record), headers)


@router.get(
    "/{response_id}",
    response_model=ResponseObject,
    responses=responses(401, 404, 422, ok={"content": STREAM}),
)
async def get_response(
    response_id: str,
    owner: Owner,
    service: Service,
    stored: StoredResponses,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1, le=2**31)] = -1,
    include: Annotated[list[str] | None, Query()] = None,
) -> Response:
    """A stored response as it stands (OpenAI's responses.retrieve); with `stream`, its
    events from the first (or after `starting_after`'s sequence number) until its end."""
    for value in include or []:
        raise InputError("include", f"{value} is not served (none of include's values is)")
    job, record = await _stored(service, stored, owner, response_id)
    if not stream:
        return json_answer(response_object(job, record))
    frames = await stream_job(
        service, owner, job.id, ResponseEvents(job, record, starting_after),
        keepalive=SSE_KEEPALIVE, join=b"".join,
    )  # fmt: skip
    return StreamingResponse(frames, media_type="text/event-stream", headers=STREAM_HEADERS)


@router.delete("/{response_id}", responses=responses(401, 404, 422))
async def delete_response(
    response_id: str, owner: Owner, service: Service, stored: StoredResponses
) -> DeletedResponse:
    """Forget a stored response (OpenAI's responses.delete): it can no longer be read or
    continued. A response still running is canceled first."""
    job, _record = await _stored(service, stored, owner, response_id)
    if not job.status.terminal:
        with contextlib.suppress(Exception):
            await service.cancel(owner, job.id)
    await stored.delete(owner, job.id)
    return DeletedResponse(id=response_id)


@router.post(
    "/{response_id}/cancel", response_model=ResponseObject, responses=responses(401, 404, 409, 422)
)
async def cancel_response(
    response_id: str, owner: Owner, service: Service, stored: StoredResponses
) -> Response:
    """Cancel a background response (OpenAI's responses.cancel): it stops at its next
    token; answered once it has (or after 10 s, still `in_progress` then). 409 for one
    that has ended or that is not a background response."""
    job, record = await _stored(service, stored, owner, response_id)
    if not record["request"].get("background"):
        raise InputError("response_id", "only a background response can be canceled")
    await service.cancel(owner, job.id)  # Conflict (409) where it has ended
    return json_answer(response_object(await _ended(service, owner, job.id), record))


@router.get(
    "/{response_id}/input_items", response_model=InputItemList, responses=responses(401, 404, 422)
)
async def list_input_items(
    response_id: str,
    owner: Owner,
    service: Service,
    stored: StoredResponses,
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> InputItemList:
    """A stored response's input items, this turn's (OpenAI's responses.input_items.list),
    newest first unless `order=asc`."""
    _job, record = await _stored(service, stored, owner, response_id)
    items = record["input_items"][:: -1 if order == "desc" else 1]
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return InputItemList(
        data=page,
        first_id=page[0]["id"] if page else None,
        last_id=page[-1]["id"] if page else None,
        has_more=len(items) > limit,
    )


async def _stored(
    service: JobService, stored: AsyncResponses, owner: str, response_id: str
) -> tuple[Job, ResponseRecord]:
    """A stored response of `owner`'s, and its job; NotFound otherwise."""
    job_id = job_id_of(response_id)
    record = await stored.get(owner, job_id) if job_id else None
    if job_id is None or record is None:
        raise NotFound(f"no response {clip(response_id)}")
    return await service.get(owner, job_id), record


async def _history(
    service: JobService, stored: AsyncResponses, owner: str, previous: str | None
) -> list[dict[str, Any]]:
    """The chat turns of the conversation a response continues: the earlier response's
    own history, its input and its answer."""
    if previous is None:
        return []
    try:
        job, record = await _stored(service, stored, owner, previous)
    except NotFound:
        raise InputError("previous_response_id", f"no stored response {clip(previous)}") from None
    if job.status is not JobStatus.SUCCEEDED or job.output is None:
        why = f"{previous} is {job.status}: a response continues one that has completed"
        raise InputError("previous_response_id", why)
    items = [InputItem.model_validate(item) for item in record["input_items"]]
    return record["history"] + chat_turns(items) + turns_of(job.output)


async def _ended(service: JobService, owner: str, job_id: str) -> Job:
    """The job once it has ended, or as it is after `CANCEL_WAIT_S`."""
    with anyio.move_on_after(CANCEL_WAIT_S):
        events = await stream_job(service, owner, job_id, no_frames)
        async for _ in events:
            pass
    return await service.get(owner, job_id)


def _listed(item: InputItem, suffix: str) -> dict[str, Any]:
    """An input item as `input_items` lists it: with an id, its content as parts."""
    if item.type == "function_call":
        return {
            "type": "function_call", "id": item.id or f"fc_{suffix}", "call_id": item.call_id,
            "name": item.name, "arguments": item.arguments, "status": "completed",
        }  # fmt: skip
    if item.type == "function_call_output":
        return {
            "type": "function_call_output", "id": item.id or f"fco_{suffix}",
            "call_id": item.call_id, "output": item.text(), "status": "completed",
        }  # fmt: skip
    kind = "output_text" if item.role == "assistant" else "input_text"
    if isinstance(item.content, list):
        content = [part.model_dump(exclude_none=True) for part in item.content]
    else:
        content = [{"type": kind, "text": item.content or ""}]
    if item.role == "assistant":
        content = [part | {"annotations": part.get("annotations", [])} for part in content]
    return {
        "type": "message", "id": item.id or f"msg_{suffix}", "role": item.role,
        "content": content, "status": "completed",
    }  # fmt: skip
