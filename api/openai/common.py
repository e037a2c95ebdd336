"""What every OpenAI-compatible route shares: errors named as OpenAI's request names
its fields, SSE frames, waiting for a job's end, and canceling the job of a client that
went away."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse

from api.deps import AppState
from api.errors import error_body
from api.streams import follow
from jobs.errors import Conflict, InputError, NotFound
from jobs.models import Job


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
    """A job that did not succeed, as an OpenAI error: 409 canceled, 422 bad input
    (naming the request's field), else 500."""
    return JSONResponse(
        failure_body(status, error, params),
        _failure_status(status, error),
        headers=dict(headers or {}),
    )


def failure_body(
    status: str, error: Mapping[str, Any] | None, params: Mapping[str, str]
) -> dict[str, Any]:
    if status == "canceled":
        return error_body("canceled", "the job was canceled")
    error = error or {}
    if error.get("type") == "invalid_input":
        field = str(error.get("field") or "input")
        reason = str(error.get("message", "")).removeprefix(f"{field}: ")
        exc = renamed(InputError(field, reason), params)
        return error_body(exc.code, exc.message, exc.field)
    return error_body(str(error.get("type", "error")), str(error.get("message", "the job failed")))


def _failure_status(status: str, error: Mapping[str, Any] | None) -> int:
    if status == "canceled":
        return 409
    return 422 if (error or {}).get("type") == "invalid_input" else 500


def job_failure(job: Job, params: Mapping[str, str]) -> JSONResponse:
    error = job.error.model_dump() if job.error is not None else None
    return failure_response(str(job.status), error, params, {"X-Job-Id": job.id})


def sse(payload: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def wait_for_end(request: Request, state: AppState, owner: str, job_id: str) -> Job:
    """The job once it has ended; cancels it if the client goes away first."""
    ended = False
    try:
        async for event in follow(state.store, state.hub, job_id, None, keepalive_s=1.0):
            if event is None and await request.is_disconnected():
                break
        else:
            ended = True
    finally:
        if not ended:
            await cancel_shielded(state, owner, job_id)
    return await state.service.get(owner, job_id)


async def cancel_shielded(state: AppState, owner: str, job_id: str) -> None:
    """Cancel the job of a client that went away (its task is being canceled: shield
    the clean-up from that)."""
    with anyio.CancelScope(shield=True), contextlib.suppress(Conflict, NotFound):
        await state.service.cancel(owner, job_id)
