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

import re
import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Owner
from api.deps import Service
from api.openai.common import Deadline, answer_when_ended, refuse_fields
from jobs.errors import InputError
from jobs.models import Job, JobCreate

router = APIRouter(prefix="/v1/images", tags=["openai"])

SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
PARAMS = {"width": "size", "height": "size", "format": "output_format", "kind": "model"}
"""Job input fields under another name in OpenAI's request."""
NOT_CARRIED = {
    "quality": "not served: set `steps` (mmq's own field) for quality",
    "style": "not served by mmq's image pipelines",
    "user": "not carried",
}
"""OpenAI fields this route refuses when they are given, rather than drop them."""


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
    """Refused when given: `steps` sets the quality here."""
    style: str | None = Field(default=None, max_length=32)
    """Refused when given: not served."""
    user: str | None = Field(default=None, max_length=256)
    """Refused when given: not carried."""
    negative_prompt: str | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    scheduler: str | None = None


@router.post("/generations", responses={422: {}, 429: {}})
async def create_image(
    request: Request,
    owner: Owner,
    body: ImageGenerationRequest,
    service: Service,
    deadline: Deadline,
) -> JSONResponse:
    """Images from a prompt (OpenAI's images.generate); answers once they are made."""
    refuse_fields(body.model_dump(include=set(NOT_CARRIED), exclude_none=True), NOT_CARRIED)
    create = JobCreate(kind="image", input=job_input(body), **deadline)
    return await answer_when_ended(
        request, service, owner, create, PARAMS, lambda job: images_response(job, body)
    )


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


def images_response(job: Job, body: ImageGenerationRequest) -> dict[str, Any]:
    output = job.output or {}
    field = "b64_json" if body.response_format == "b64_json" else "url"
    return {
        "created": int(job.finished_at or time.time()),
        "data": [{field: image[field], "revised_prompt": None} for image in output["images"]],
        "output_format": body.output_format,
        "size": f"{output['width']}x{output['height']}",
    }
