"""`POST /v1/images/generations`, OpenAI-compatible: an `image` job, answered when it ends.

The route submits an `image` job through the JobService (same queues, batching, limits
and auth as `/v1/jobs`), follows the job's events until it ends, and answers OpenAI's
`ImagesResponse`: each image as a signed `url` or as `b64_json`. `size` is `WxH`; mmq's
own image options (`negative_prompt`, `steps`, `guidance_scale`, `seed`, `scheduler`) are
accepted as extra fields (`extra_body` in the `openai` client). Errors use OpenAI's
format; 422 names the field as this request does (`size`, not `input.width`). A client
that goes away cancels its job.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import current_owner
from api.deps import AppState, get_service, get_state
from api.errors import error_body
from api.service import JobService
from api.streams import follow
from jobs.errors import Conflict, InputError, NotFound
from jobs.models import Job, JobCreate
from jobs.schemas.image import ImageInput
from jobs.states import JobStatus

router = APIRouter(prefix="/v1/images", tags=["openai"])

Owner = Annotated[str, Depends(current_owner)]
Service = Annotated[JobService, Depends(get_service)]

SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
PARAMS = {"width": "size", "height": "size", "format": "output_format", "kind": "model"}
"""Job input fields under another name in OpenAI's request."""


class ImageGenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    model: str | None = Field(default=None, max_length=256)
    """An image pipeline or one of its aliases; unset: the first image pipeline."""
    n: int = 1
    size: str | None = Field(default=None, max_length=16)
    """`WIDTHxHEIGHT` (multiples of 8, up to `limits.image_max_side`), or `auto`."""
    response_format: Literal["url", "b64_json"] = "url"
    output_format: Literal["png", "jpeg", "webp"] = "png"
    quality: str | None = Field(default=None, max_length=32)
    """Accepted for compatibility; `steps` sets the quality here."""
    style: str | None = Field(default=None, max_length=32)
    """Accepted for compatibility, unused."""
    user: str | None = Field(default=None, max_length=256)
    """Accepted for compatibility, unused."""
    negative_prompt: str | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    scheduler: str | None = None


@router.post("/generations", responses={422: {}, 429: {}})
async def create_image(
    request: Request, body: ImageGenerationRequest, owner: Owner, service: Service
) -> JSONResponse:
    """Images from a prompt (OpenAI's images.generate); answers once they are made."""
    state = get_state(request)
    create = JobCreate(kind="image", input=job_input(body))
    try:
        pipeline, normalised = service.validate(create)
        ImageInput.model_validate(normalised).check_pipeline(state.settings.pipelines[pipeline])
        job, _ = await service.submit(owner, create)
    except InputError as exc:
        raise openai_error(exc) from None
    if not await _until_end(state, request, job.id):
        with contextlib.suppress(Conflict, NotFound):
            await service.cancel(owner, job.id)
        return JSONResponse(error_body("canceled", "the client went away"), 499)
    job = await service.get(owner, job.id)
    headers = {"X-Job-Id": job.id}
    if job.status is not JobStatus.SUCCEEDED:
        return _failure(job, headers)
    return JSONResponse(images_response(job, body), headers=headers)


def job_input(body: ImageGenerationRequest) -> dict[str, Any]:
    """The `image` job input of an OpenAI request."""
    extras = body.model_dump(
        include={"model", "negative_prompt", "steps", "guidance_scale", "seed", "scheduler"},
        exclude_none=True,
    )
    inp: dict[str, Any] = {
        "prompt": body.prompt,
        "n": body.n,
        "format": body.output_format,
        "response_format": body.response_format,
        **extras,
    }
    if body.size not in (None, "auto"):
        match = SIZE.match(body.size or "")
        if match is None:
            raise InputError("size", "must be WIDTHxHEIGHT (e.g. 512x512) or auto")
        inp["width"], inp["height"] = int(match.group(1)), int(match.group(2))
    return inp


def openai_error(exc: InputError) -> InputError:
    """The same error, naming the field as OpenAI's request does."""
    field = exc.field.removeprefix("input.")
    return type(exc)(PARAMS.get(field, field), exc.reason)


async def _until_end(state: AppState, request: Request, job_id: str) -> bool:
    """Follow the job until its terminal event; False if the client left first."""
    keepalive_s = state.settings.api.keepalive_s
    async for event in follow(state.store, state.hub, job_id, None, keepalive_s):
        if event is None and await request.is_disconnected():
            return False
    return True


def images_response(job: Job, body: ImageGenerationRequest) -> dict[str, Any]:
    output = job.output or {}
    field = "b64_json" if body.response_format == "b64_json" else "url"
    return {
        "created": int(job.finished_at or time.time()),
        "data": [{field: image[field], "revised_prompt": None} for image in output["images"]],
        "output_format": body.output_format,
        "size": f"{output['width']}x{output['height']}",
    }


def _failure(job: Job, headers: dict[str, str]) -> JSONResponse:
    if job.status is JobStatus.CANCELED:
        return JSONResponse(error_body("canceled", "the job was canceled"), 409, headers)
    error = job.error
    if error is not None and error.type == "invalid_input":
        field = error.field or "input"
        exc = openai_error(InputError(field, error.message.removeprefix(f"{field}: ")))
        return JSONResponse(error_body(exc.code, exc.message, exc.field), 422, headers)
    etype, message = (error.type, error.message) if error else ("error", "the job failed")
    return JSONResponse(error_body(etype, message), 500, headers)
