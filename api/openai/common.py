"""What every OpenAI-compatible route shares: the deadline header, errors named as
OpenAI's request names its fields, and waiting for a job's end (canceling it if the
client goes away first)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from typing_extensions import TypedDict

from api.error_handlers import error_answer
from api.event_feed import Batches
from api.openai.answers import failure, failure_status
from api.openai.protocol import json_answer
from api.service import JobService
from api.streaming import stream_job, until_disconnected
from jobs.errors import InputError
from jobs.models import Event, EventType, Job, JobCreate
from jobs.settings import MAX_QUEUE_S
from jobs.states import JobStatus


class DeadlineFields(TypedDict, total=False):
    """A job's deadline fields (`JobCreate(**deadline)`)."""

    max_queue_s: float
    cancel_at_deadline: bool


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
) -> DeadlineFields:
    return {} if x_request_timeout is None else deadline_fields(x_request_timeout)


def deadline_fields(seconds: float) -> DeadlineFields:
    """The deadline fields of `X-Request-Timeout: seconds`."""
    return {"max_queue_s": seconds, "cancel_at_deadline": True}


Deadline = Annotated[DeadlineFields, Depends(_request_timeout)]
"""`X-Request-Timeout: SECONDS` as the job's deadline fields (`JobCreate(**deadline)`)."""


def renamed(exc: InputError, params: Mapping[str, str]) -> InputError:
    """The same error, naming the field as OpenAI's request does (`input`, not
    `input.text`): `params` maps job input fields to request fields."""
    field = exc.field.removeprefix("input.")
    return type(exc)(params.get(field, field), exc.reason)


def failure_response(
    status: str,
    error: Mapping[str, object] | None,
    params: Mapping[str, str],
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A job that did not succeed, as an OpenAI error: 409 canceled, 408 expired (its
    deadline passed in the queue), 422 bad input (naming the request's field), else 500."""
    body = failure(status, error, params)
    return error_answer(body, failure_status(status, error), dict(headers or {}))


def job_failure(job: Job, params: Mapping[str, str]) -> JSONResponse:
    error = job.error.model_dump() if job.error is not None else None
    return failure_response(str(job.status), error, params, {"X-Job-Id": job.id})


def ended_badly(event: Event) -> bool:
    """Whether the event is the terminal status of a job that failed or was canceled."""
    return event.type is EventType.STATUS and event.data.get("status") in {
        "failed",
        "canceled",
        "expired",
    }


def no_frames(event: Event) -> tuple[bytes, ...]:
    """`stream_job`'s frames of a route that only waits for the end."""
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
        service, owner, job_id, no_frames, cancel_on_disconnect=True, events=followed
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
    answer: Callable[[Job], BaseModel],
) -> Response:
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
    return json_answer(answer(job), {"X-Job-Id": job.id})
