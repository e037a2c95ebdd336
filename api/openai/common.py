"""What every OpenAI-compatible route shares: errors named as OpenAI's request names
its fields, SSE frames, and waiting for a job's end (canceling it if the client goes
away first)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

import orjson
from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse

from api.openai.answers import failure_body, failure_status
from api.service import JobService
from api.streaming import stream_job, until_disconnected
from api.streams import Batches
from jobs.errors import InputError
from jobs.models import Event, EventType, Job, JobCreate
from jobs.settings import MAX_QUEUE_S
from jobs.states import JobStatus

SSE_KEEPALIVE = b": keep-alive\n\n"


async def _request_timeout(  # async: FastAPI runs a plain `def` on its thread pool
    x_request_timeout: Annotated[
        float | None,
        Header(
            gt=0,
            le=MAX_QUEUE_S,
            description="Seconds after which the answer is no longer wanted: a job still "
            "queued then ends `expired` without running, a running one is canceled.",
        ),
    ] = None,
) -> dict[str, Any]:
    if x_request_timeout is None:
        return {}
    return {"max_queue_s": x_request_timeout, "cancel_at_deadline": True}


Deadline = Annotated[dict[str, Any], Depends(_request_timeout)]
"""`X-Request-Timeout: SECONDS` as the job's deadline fields (`JobCreate(**deadline)`)."""


def renamed(exc: InputError, params: Mapping[str, str]) -> InputError:
    """The same error, naming the field as OpenAI's request does (`input`, not
    `input.text`): `params` maps job input fields to request fields."""
    field = exc.field.removeprefix("input.")
    return type(exc)(params.get(field, field), exc.reason)


def failure_response(
    status: str,
    error: Mapping[str, Any] | None,
    params: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A job that did not succeed, as an OpenAI error: 409 canceled, 408 expired (its
    deadline passed in the queue), 422 bad input (naming the request's field), else 500."""
    return JSONResponse(
        failure_body(status, error, params),
        failure_status(status, error),
        headers=dict(headers or {}),
    )


def job_failure(job: Job, params: Mapping[str, str]) -> JSONResponse:
    error = job.error.model_dump() if job.error is not None else None
    return failure_response(str(job.status), error, params, {"X-Job-Id": job.id})


CLOSED: dict[str, Any] = {"additionalProperties": False}
"""`json_schema_extra` of a request model that keeps what it does not define aside
(`extra="allow"`) only to refuse it by name: its schema says no other field is taken."""


def refuse_fields(extra: Mapping[str, Any] | None, why: Mapping[str, str], where: str = "") -> None:
    """InputError (422) for the first field in `extra`, what a request model took but does
    not define (pydantic's `model_extra`): an OpenAI field mmq does not carry (`why` says
    why) or one it does not know. An OpenAI route never drops a field without a word."""
    for name in extra or {}:
        reason = why.get(name, "not a field of this request that mmq knows")
        raise InputError(f"{where}{name}", reason)


def sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def ended_badly(event: Event) -> bool:
    """Whether the event is the terminal status of a job that failed or was canceled."""
    return event.type is EventType.STATUS and event.data.get("status") in {
        "failed",
        "canceled",
        "expired",
    }


def _no_frames(event: Event) -> tuple[bytes, ...]:
    return ()


async def wait_for_end(
    request: Request,
    service: JobService,
    owner: str,
    job_id: str,
    followed: Batches | None = None,
) -> Job:
    """The job once it has ended; cancels it if the client goes away first. `followed`:
    its events from `JobService.submit_following`."""
    events = await stream_job(
        service, owner, job_id, _no_frames, cancel_on_disconnect=True, events=followed
    )
    async with until_disconnected(request):
        async for _ in events:
            pass
    return await service.get(owner, job_id)


async def answer_when_ended(
    request: Request,
    service: JobService,
    owner: str,
    create: JobCreate,
    params: Mapping[str, str],
    answer: Callable[[Job], dict[str, Any]],
) -> JSONResponse:
    """Submit `create`, wait for the job's end (canceled if the client goes away first) and
    answer `answer(job)`, or OpenAI's error for a job that did not succeed; a refused
    submit names the request's field (`params`)."""
    try:
        job, events = await service.submit_following(owner, create)
    except InputError as exc:
        raise renamed(exc, params) from None
    job = await wait_for_end(request, service, owner, job.id, events)
    if job.status is not JobStatus.SUCCEEDED:
        return job_failure(job, params)
    return JSONResponse(answer(job), headers={"X-Job-Id": job.id})
