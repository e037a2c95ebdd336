"""`POST /v1/images/edits`, OpenAI-compatible: an `image` job from an uploaded image,
answered when it ends.

The form's `image` (and its optional `mask`) are checked by their headers (PNG, JPEG or
WebP; a mask of the image's size), stored as uploads, and named by an `image` job's
`init_image` and `mask_image`: inpainting with a mask, image-to-image without one, on the
same queues, batching, progress events and limits as every image job. The answer is
OpenAI's `ImagesResponse`, as for generations. 422 names the form's field (`image`,
`mask`, `size`...), 413 an upload over `limits.image_max_bytes`. A client that goes away
cancels its job.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field, ValidationError
from starlette.datastructures import FormData, UploadFile

from api.auth import Owner
from api.deps import Service
from api.forms import multipart_body
from api.image_headers import CONTENT_TYPES, ImageHeader, read_header
from api.openai.common import Deadline, job_failure, renamed, wait_for_end
from api.openai.images import SIZE, SIZE_PATTERN, ImagesResponse, images_response
from api.openai.protocol import OpenAIRequest, json_answer, responses
from api.service import JobService
from jobs.errors import InputError, MmqError, NotFound, TooLarge
from jobs.models import JobCreate
from jobs.schemas import image, validation_error_field
from jobs.settings import Limits
from jobs.states import JobStatus

router = APIRouter(prefix="/v1/images", tags=["openai"])

PATH = "/v1/images/edits"
IMAGE_FIELDS = ("image", "image[]")
"""The image's part: OpenAI's client sends `image[]` when given a list."""
PARAMS = {
    "width": "size",
    "height": "size",
    "format": "output_format",
    "kind": "model",
    "init_image": "image",
    "mask_image": "mask",
}
"""Job input fields under another name in OpenAI's request."""
PENDING = {"image": "pending/uploads/0/image.png", "mask": "pending/uploads/0/mask.png"}
"""Stand in for the uploads' keys while the rest of the request is validated."""
MAX_FILES = 18
"""File parts read before refusing by name (OpenAI takes 16 images, a mask, a markup)."""
NOT_CARRIED = {
    "background": "not served: the images are opaque",
    "input_fidelity": "not served: set `strength` (mmq's own field) for how far to go",
    "quality": "not served: set `steps` (mmq's own field) for quality",
    "output_compression": "not served",
    "partial_images": "not served: progress is on the job's events (GET /v1/jobs/{id}/events)",
    "stream": "not served: progress is on the job's events (GET /v1/jobs/{id}/events)",
    "markup": "not served",
    "style": "not served by mmq's image pipelines",
    "user": "not carried",
    "safety_identifier": "not carried",
}
"""OpenAI fields this route refuses by name when they are given, rather than drop them
(any other unknown field is refused too)."""


class ImageEditForm(OpenAIRequest):
    """The text fields of an edit (the image and the mask are its file parts); each is
    checked as the `image` job input checks it (`jobs.schemas.image`)."""

    not_carried = NOT_CARRIED

    prompt: image.Prompt
    model: str | None = Field(default=None, max_length=256)
    """An image pipeline, its model or one of its aliases (`GET /v1/models` lists them);
    unset: the first one."""
    n: image.Count = 1
    """Images, up to `limits.image_max_n` (a deployment setting)."""
    size: str | None = Field(default=None, json_schema_extra={"pattern": SIZE_PATTERN})
    """`WIDTHxHEIGHT` (each a multiple of 8, from 64 up to `limits.image_max_side`); unset
    or `auto`: the image's own size, made a multiple of 8 within the limit."""
    response_format: image.ResponseFormat = "url"
    output_format: image.Format = "png"
    negative_prompt: image.NegativePrompt | None = None
    steps: image.Steps | None = None
    """Denoising steps at strength 1 (default 30), up to `limits.image_max_steps`."""
    guidance_scale: image.GuidanceScale | None = None
    seed: image.Seed | None = None
    scheduler: image.Scheduler | None = None
    """One that the pipeline's `options.schedulers` allows (a deployment setting)."""
    strength: image.Strength | None = None
    """How far from the image (default 0.8; 1.0: all `steps` run)."""


FILES = {
    "image": "The image to edit: one PNG, JPEG or WebP file (also taken as `image[]`), at "
    "most `limits.image_max_bytes` (413 above).",
}
OPTIONAL_FILES = {
    "mask": "Where to paint: an image of the same size whose fully transparent pixels "
    "(OpenAI's masks) or, without an alpha channel, white pixels are painted anew, the rest "
    "kept (inpainting). Without it, the whole image is redrawn (image-to-image).",
}
EDIT_BODY = multipart_body(ImageEditForm, FILES, OPTIONAL_FILES)


@dataclass
class Upload:
    """An image part of the form, read and checked by its header."""

    data: bytes
    header: ImageHeader
    filename: str


@dataclass
class Edit:
    fields: ImageEditForm
    image: Upload
    mask: Upload | None

    def job_input(self, keys: dict[str, str], max_side: int) -> dict[str, object]:
        """The `image` job input, naming the uploads by `keys` (`image`, `mask`)."""
        extras = self.fields.model_dump(
            include={"model", "negative_prompt", "steps", "guidance_scale", "seed", "scheduler"},
            exclude_none=True,
        )
        width, height = output_size(self.fields.size, self.image.header, max_side)
        inp: dict[str, object] = {
            "prompt": self.fields.prompt,
            "n": self.fields.n,
            "format": self.fields.output_format,
            "response_format": self.fields.response_format,
            "width": width,
            "height": height,
            "init_image": keys["image"],
            **extras,
        }
        if self.fields.strength is not None:
            inp["strength"] = self.fields.strength
        if self.mask is not None:
            inp["mask_image"] = keys["mask"]
        return inp


@router.post(
    "/edits",
    response_model=ImagesResponse,
    responses=responses(401, 408, 409, 413, 422, 429, 500, 503),
    openapi_extra=EDIT_BODY,
)
async def edit_image(
    request: Request, owner: Owner, service: Service, deadline: Deadline
) -> Response:
    """An image repainted from a prompt (OpenAI's images.edit): inpainting where the mask
    says, image-to-image without one; answers once the images are made."""
    max_side = service.settings.limits.image_max_side
    # Parsed here, after the API key is checked, not by FastAPI before it.
    form = await request.form(max_files=MAX_FILES, max_fields=32)
    try:
        edit = await read_form(form, service.settings.limits)
        service.validate(JobCreate(kind="image", input=edit.job_input(PENDING, max_side)))
        keys = await _store(service, owner, edit)
        create = JobCreate(kind="image", input=edit.job_input(keys, max_side), **deadline)
        try:
            job, followed = await service.submit_following(owner, create)
        except MmqError:
            await _forget(service, keys)
            raise
    except InputError as exc:
        raise renamed(exc, PARAMS) from None
    finally:
        await form.close()
    ended = await wait_for_end(request, service, owner, job.id, followed)
    if ended.status is not JobStatus.SUCCEEDED:
        return job_failure(ended, PARAMS)
    fields = edit.fields
    answer = images_response(ended, fields.response_format, fields.output_format)
    return json_answer(answer, {"X-Job-Id": job.id})


async def read_form(form: FormData, limits: Limits) -> Edit:
    """The form's fields and its image and mask, checked; InputError (or TooLarge) naming
    the form's field."""
    values: dict[str, str] = {}
    for name, value in form.multi_items():
        if isinstance(value, str) and name not in (*IMAGE_FIELDS, "mask"):
            values[name] = value
        elif not isinstance(value, str) and name not in (*IMAGE_FIELDS, "mask"):
            raise InputError(name, NOT_CARRIED.get(name, "not a file part of this request"))
    try:
        fields = ImageEditForm.model_validate(values)
    except ValidationError as exc:
        raise validation_error_field(exc, "") from None
    images = [part for name in IMAGE_FIELDS for part in form.getlist(name)]
    if not images:
        raise InputError("image", "send the image to edit as the multipart/form-data file 'image'")
    if len(images) > 1:
        raise InputError("image", f"one image per edit is served here ({len(images)} were sent)")
    masks = form.getlist("mask")
    if len(masks) > 1:
        raise InputError("mask", f"one mask per edit ({len(masks)} were sent)")
    picture = await _read(images[0], "image", limits)
    mask = await _read(masks[0], "mask", limits) if masks else None
    if mask is not None and mask.header.size != picture.header.size:
        (w, h), (mw, mh) = picture.header.size, mask.header.size
        raise InputError("mask", f"is {mw}x{mh}, not the image's size ({w}x{h})")
    return Edit(fields, picture, mask)


async def _read(part: str | UploadFile, field: str, limits: Limits) -> Upload:
    if not isinstance(part, UploadFile):
        raise InputError(field, f"send it as a file (a multipart/form-data file part '{field}')")
    limit = limits.image_max_bytes
    if part.size is not None and part.size > limit:
        raise TooLarge(field, f"is {part.size} bytes, over the limit of {limit} bytes")
    data = await part.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(field, f"is over the limit of {limit} bytes")
    header = read_header(data, field)
    pixels = header.width * header.height
    if pixels > limits.image_max_pixels:
        raise TooLarge(
            field,
            f"is {header.width}x{header.height}, {pixels} pixels, over the limit of "
            f"{limits.image_max_pixels} (limits.image_max_pixels)",
        )
    return Upload(data, header, part.filename or f"{field}.{header.format}")


def output_size(size: str | None, header: ImageHeader, max_side: int) -> tuple[int, int]:
    """The edit's `WIDTHxHEIGHT`: as asked, or the image's own size scaled down to
    `max_side` and to multiples of 8 (at least 64)."""
    if size is not None:
        match = SIZE.match(size)
        if match is None:
            raise InputError("size", "must be WIDTHxHEIGHT (e.g. 512x512) or auto")
        if match.group(1) is not None:
            return int(match.group(1)), int(match.group(2))
    scale = min(1.0, max_side / max(header.size))
    width, height = (max(64, int(side * scale) // 8 * 8) for side in header.size)
    return width, height


async def _store(service: JobService, owner: str, edit: Edit) -> dict[str, str]:
    """Store the image and the mask as uploads of `owner`; their keys."""
    keys: dict[str, str] = {}
    parts = {"image": edit.image, "mask": edit.mask}
    try:
        for name, part in parts.items():
            if part is not None:
                content_type = CONTENT_TYPES[part.header.format]
                stored = await service.files.store(
                    owner, io.BytesIO(part.data), part.filename, content_type
                )
                keys[name] = stored.key
    except MmqError:
        await _forget(service, keys)
        raise
    return keys


async def _forget(service: JobService, keys: dict[str, str]) -> None:
    for key in keys.values():
        with contextlib.suppress(NotFound):
            await service.files.delete(key)
