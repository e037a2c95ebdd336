"""Image generation job input, and the options of image pipelines (read by the API too)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX, JobInput, over_limit
from jobs.settings import Limits, PipelineConfig


class SchedulerSpec(BaseModel):
    """A diffusers scheduler by class name (the API never imports diffusers)."""

    model_config = ConfigDict(frozen=True)

    cls: str
    kwargs: dict[str, bool | int | float | str] = Field(default_factory=dict)
    """Its config's switches (`use_karras_sigmas`...)."""


SCHEDULERS: dict[str, SchedulerSpec] = {
    "ddim": SchedulerSpec(cls="DDIMScheduler"),
    "ddpm": SchedulerSpec(cls="DDPMScheduler"),
    "pndm": SchedulerSpec(cls="PNDMScheduler"),
    "lms": SchedulerSpec(cls="LMSDiscreteScheduler"),
    "euler": SchedulerSpec(cls="EulerDiscreteScheduler"),
    "euler_a": SchedulerSpec(cls="EulerAncestralDiscreteScheduler"),
    "heun": SchedulerSpec(cls="HeunDiscreteScheduler"),
    "dpm++_2m": SchedulerSpec(cls="DPMSolverMultistepScheduler"),
    "dpm++_2m_karras": SchedulerSpec(
        cls="DPMSolverMultistepScheduler", kwargs={"use_karras_sigmas": True}
    ),
    "unipc": SchedulerSpec(cls="UniPCMultistepScheduler"),
}
"""Scheduler names a request may give; a pipeline's `options.schedulers` may narrow them."""


def _known_scheduler(value: str) -> str:
    if value not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {value!r}; use one of {sorted(SCHEDULERS)}")
    return value


# The constraints of the fields that OpenAI's image request carries too
# (`api.openai.images`): one definition, so that the request validates and publishes what
# the job input does.
Prompt = Annotated[str, Field(min_length=1, max_length=4000)]
NegativePrompt = Annotated[str, Field(max_length=4000)]
Side = Annotated[int, Field(ge=64, le=99_992, multiple_of=8)]


def _side_pattern() -> str:
    """A regex of the numerals (up to 5 digits) that `Side` takes: multiples of 8 from
    64. A number is a multiple of 8 when its last three digits are; those are an even
    hundreds digit and two digits that are a multiple of 8, or an odd one and two
    digits that are 4 more than one."""

    def two(start: int) -> str:
        return "|".join(f"{n:02d}" for n in range(start, 100, 8))

    even, odd = f"(?:{two(0)})", f"(?:{two(4)})"
    three = f"[2468]{even}|[13579]{odd}"
    return f"(?:{two(64)}|{three}|[1-9][0-9]?(?:[02468]{even}|[13579]{odd}))"


SIDE_PATTERN = _side_pattern()
"""`Side` as a numeral: how OpenAI's `size` (`WIDTHxHEIGHT`) publishes it."""
Steps = Annotated[int, Field(ge=1, le=COUNT_MAX)]
GuidanceScale = Annotated[float, Field(ge=0.0, le=30.0)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
Count = Annotated[int, Field(ge=1, le=COUNT_MAX)]
Scheduler = Annotated[
    str,
    Field(max_length=64, json_schema_extra={"enum": sorted(SCHEDULERS)}),
    AfterValidator(_known_scheduler),
]
Format = Literal["png", "jpeg", "webp"]
ResponseFormat = Literal["url", "b64_json"]
Strength = Annotated[float, Field(gt=0.0, le=1.0)]
Mode = Literal["txt2img", "img2img", "inpaint"]


class ImageInput(JobInput):
    prompt: Prompt
    negative_prompt: NegativePrompt | None = None
    width: Side = 512
    """A multiple of 8, up to `limits.image_max_side` (a deployment setting)."""
    height: Side = 512
    """A multiple of 8, up to `limits.image_max_side` (a deployment setting)."""
    steps: Steps = 30
    """Denoising steps, up to `limits.image_max_steps` (a deployment setting)."""
    guidance_scale: GuidanceScale = 7.5
    seed: Seed | None = None
    """Seed of the first image (image i gets seed + i); unset: picked, and reported."""
    n: Count = 1
    """Images, up to `limits.image_max_n` (a deployment setting)."""
    scheduler: Scheduler | None = None
    """One of `SCHEDULERS` that the pipeline's `options.schedulers` allows (a deployment
    setting); unset: the pipeline's default (the model's own scheduler)."""
    format: Format = "png"
    response_format: ResponseFormat = "url"
    """`b64_json`: the output also carries each image base64-encoded."""
    init_image: str | None = Field(default=None, max_length=4096)
    """Stored file key of a start image (image-to-image)."""
    strength: Strength = 0.8
    """Image-to-image and inpainting: how far from the start image (1.0: all `steps`
    run)."""
    mask_image: str | None = Field(default=None, max_length=4096)
    """Stored file key of a mask (inpainting; needs `init_image`, of the same size): its
    white pixels are painted anew and its black ones kept, or, in a mask with an alpha
    channel (OpenAI's), its fully transparent pixels are painted anew."""

    @field_validator("mask_image")
    @classmethod
    def _mask_needs_an_image(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not info.data.get("init_image"):
            raise ValueError("a mask needs init_image, the image it masks")
        return value

    @property
    def mode(self) -> Mode:
        """What the request asks of the model: a new image, one from `init_image`, or
        `init_image` repainted where `mask_image` says."""
        if self.init_image is None:
            return "txt2img"
        return "img2img" if self.mask_image is None else "inpaint"

    def cost(self) -> int:
        """Megapixel-steps: denoising steps times each image's pixels (in millions), for
        every image asked for (at least 1)."""
        return max(1, math.ceil(self.steps * self.width * self.height * self.n / 1_000_000))

    def check_limits(self, limits: Limits) -> None:
        for name in ("width", "height"):
            value = getattr(self, name)
            if value > limits.image_max_side:
                raise over_limit(name, value, limits.image_max_side, "pixels")
        if self.steps > limits.image_max_steps:
            raise over_limit("steps", self.steps, limits.image_max_steps)
        if self.n > limits.image_max_n:
            raise over_limit("n", self.n, limits.image_max_n)

    def check_pipeline(self, config: PipelineConfig) -> None:
        """Raise `InputError("scheduler")` for a scheduler that the pipeline `config` does
        not serve; reads settings only, so the API can call it."""
        options = config.options_as(ImageOptions)
        if self.scheduler is not None and self.scheduler not in options.schedulers:
            allowed = ", ".join(options.schedulers)
            raise InputError("scheduler", f"{self.scheduler!r} is not served here ({allowed})")
        if self.mode == "img2img" and not options.img2img:
            raise InputError("init_image", "image-to-image is off on this pipeline")
        if self.mode == "inpaint" and not options.inpaint:
            raise InputError("mask_image", "inpainting is off on this pipeline")


class ImageOptions(BaseModel):
    """`options` of an image pipeline (`[pipelines.NAME.options]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Weights and compute dtype; auto: float32 on a CPU, float16 on CUDA."""
    variant: str | None = None
    """Weights variant to load (e.g. `fp16`), where the model has one."""
    attention_slicing: bool = False
    """Saves memory, costs speed: leave it off on a GPU with room."""
    channels_last: bool | Literal["auto"] = "auto"
    """UNet and VAE in channels-last memory format; auto: on CUDA."""
    compile: bool = False
    """`torch.compile` the UNet (the first batch of each new shape is slow)."""
    compile_mode: str = "max-autotune-no-cudagraphs"
    vae_tiling: bool | Literal["auto"] = "auto"
    """Decode large images in tiles; auto: on where `limits.image_max_side` exceeds the
    model's native size (images up to the tile size are decoded whole either way)."""
    vae_slicing: bool = False
    """Decode a batch one image at a time (lower peak memory for large batches)."""
    img2img: bool = True
    """Serve `init_image` requests, where the model family has an image-to-image pipeline."""
    inpaint: bool = True
    """Serve `mask_image` requests (inpainting, `POST /v1/images/edits` with a mask),
    where the model family has an inpainting pipeline."""
    safety_checker: bool = True
    """Keep the model's safety checker, where it has one (flagged images come back black,
    with `nsfw: true`)."""
    schedulers: list[str] = Field(default_factory=lambda: list(SCHEDULERS))
    """Scheduler names requests may use here (a subset of `SCHEDULERS`)."""
    default_scheduler: str | None = None
    """Scheduler of requests that name none; unset: the model's own."""
    preview_every_steps: int = Field(default=0, ge=0)
    """Attach a small JPEG preview (data URI) to every Nth progress event; 0: none."""
    preview_max_side: int = Field(default=64, ge=8, le=512)
    warmup: bool = True
    """Generate one 1-step image at load, before the first job."""

    @model_validator(mode="after")
    def _check(self) -> ImageOptions:
        names = [*self.schedulers, *([self.default_scheduler] if self.default_scheduler else [])]
        unknown = sorted(set(names) - set(SCHEDULERS))
        if unknown:
            raise ValueError(f"unknown schedulers {unknown}; known: {sorted(SCHEDULERS)}")
        if self.default_scheduler and self.default_scheduler not in self.schedulers:
            raise ValueError("default_scheduler is not one of schedulers")
        return self
