"""Image generation job input."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from jobs.schemas.base import JobInput, over_limit
from jobs.settings import Limits


class ImageInput(JobInput):
    prompt: str = Field(min_length=1, max_length=4000)
    negative_prompt: str | None = Field(default=None, max_length=4000)
    width: int = Field(default=512, ge=64)
    height: int = Field(default=512, ge=64)
    steps: int = Field(default=30, ge=1)
    guidance_scale: float = Field(default=7.5, ge=0.0, le=30.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    n: int = Field(default=1, ge=1)
    scheduler: str | None = Field(default=None, max_length=64)
    format: Literal["png", "jpeg", "webp"] = "png"
    response_format: Literal["url", "b64_json"] = "url"
    init_image: str | None = Field(default=None, max_length=4096)
    """Stored file key of a start image (image-to-image)."""
    strength: float = Field(default=0.8, gt=0.0, le=1.0)

    @field_validator("width", "height")
    @classmethod
    def _multiple_of_8(cls, value: int) -> int:
        if value % 8:
            raise ValueError("must be a multiple of 8")
        return value

    def check_limits(self, limits: Limits) -> None:
        for field in ("width", "height"):
            value = getattr(self, field)
            if value > limits.image_max_side:
                raise over_limit(field, value, limits.image_max_side, "pixels")
        if self.steps > limits.image_max_steps:
            raise over_limit("steps", self.steps, limits.image_max_steps)
        if self.n > limits.image_max_n:
            raise over_limit("n", self.n, limits.image_max_n)
