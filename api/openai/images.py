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
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from api.auth import Owner
from api.deps import Service
from api.openai.common import Deadline, answer_when_ended
from api.openai.protocol import OpenAIRequest, OpenAIResponse, omitted, responses
from jobs.errors import InputError
from jobs.models import Job, JobCreate
from jobs.schemas import image

router = APIRouter(prefix="/v1/images", tags=["openai"])

SIZE = re.compile(r"^(?:(\d{1,5})x(\d{1,5})|auto)$")
SIZE_PATTERN = rf"^(?:{image.SIDE_PATTERN}x{image.SIDE_PATTERN}|auto)$"
"""`size` as published: what `SIZE` parses and the job's width and height (`image.Side`)
take. It is not checked itself: a bad side is refused by the job input, saying why."""
PARAMS = {"width": "size", "height": "size", "format": "output_format", "kind": "model"}
"""Job input fields under another name in OpenAI's request."""
NOT_CARRIED = {
    "quality": "not served: set `steps` (mmq's own field) for quality",
    "style": "not served by mmq's image pipelines",
    "user": "not carried",
}
"""OpenAI fields this route refuses by name when they are given, rather than drop them
(any other unknown field is refused too)."""


class ImageGenerationRequest(OpenAIRequest):
    """OpenAI's request, with mmq's own image options; each field is checked as the
    `image` job input checks it (`jobs.schemas.image`)."""

    not_carried = NOT_CARRIED

    prompt: image.Prompt
    model: str | None = Field(default=None, max_length=256)
    """An image pipeline, its model or one of its aliases (the deployment's
    configuration says which: `GET /v1/models` lists them); unset: the first one."""
    n: image.Count = 1
    """Images, up to `limits.image_max_n` (a deployment setting)."""
    size: str | None = Field(default=None, json_schema_extra={"pattern": SIZE_PATTERN})
    """`WIDTHxHEIGHT` (each a multiple of 8, from 64 up to `limits.image_max_side`, a
    deployment setting), or `auto`."""
    response_format: image.ResponseFormat = "url"
    output_format: image.Format = "png"
    negative_prompt: image.NegativePrompt | None = None
    steps: image.Steps | None = None
    """Denoising steps (default 30), up to `limits.image_max_steps` (a deployment
    setting)."""
    guidance_scale: image.GuidanceScale | None = None
    seed: image.Seed | None = None
    scheduler: image.Scheduler | None = None
    """One that the pipeline's `options.schedulers` allows (a deployment setting)."""


class Image(OpenAIResponse):
    url: str | None = omitted()
    """A signed URL of the stored image (`response_format: url`)."""
    b64_json: str | None = omitted()
    """The image's bytes in base64 (`response_format: b64_json`)."""
    revised_prompt: str | None = None
    """Always null: the prompt is used as it is."""


class ImagesResponse(OpenAIResponse):
    created: int
    data: list[Image]
    output_format: image.Format
    size: str
    """`WIDTHxHEIGHT` of the images."""


@router.post(
    "/generations",
    response_model=ImagesResponse,
    responses=responses(401, 408, 409, 413, 422, 429, 500, 503),
)
async def create_image(
    request: Request,
    owner: Owner,
    body: ImageGenerationRequest,
    service: Service,
    deadline: Deadline,
) -> Response:
    """Images from a prompt (OpenAI's images.generate); answers once they are made."""
    create = JobCreate(kind="image", input=job_input(body), **deadline)
    return await answer_when_ended(
        request,
        service,
        owner,
        create,
        PARAMS,
        lambda job: images_response(job, body.response_format, body.output_format),
    )


def job_input(body: ImageGenerationRequest) -> dict[str, object]:
    """The `image` job input of an OpenAI request."""
    extras = body.model_dump(
        include={"model", "negative_prompt", "steps", "guidance_scale", "seed", "scheduler"},
        exclude_none=True,
    )
    inp: dict[str, object] = {
        "prompt": body.prompt,
        "n": body.n,
        "format": body.output_format,
        "response_format": body.response_format,
        **extras,
    }
    if body.size is not None:
        match = SIZE.match(body.size)
        if match is None:
            raise InputError("size", "must be WIDTHxHEIGHT (e.g. 512x512) or auto")
        if match.group(1) is not None:
            inp["width"], inp["height"] = int(match.group(1)), int(match.group(2))
    return inp


def images_response(
    job: Job, response_format: image.ResponseFormat, output_format: image.Format
) -> ImagesResponse:
    """OpenAI's answer of an image job that succeeded (generations and edits)."""
    output = job.output or {}
    field: Literal["url", "b64_json"] = "b64_json" if response_format == "b64_json" else "url"
    return ImagesResponse(
        created=int(job.finished_at or time.time()),
        data=[Image.model_validate({field: made[field]}) for made in output["images"]],
        output_format=output_format,
        size=f"{output['width']}x{output['height']}",
    )
