"""One diffusers call for a batch of requests: per-image prompts and generators, progress,
and cancel between steps.

Each image is one row of the call's batch tensor, with its own `torch.Generator` seeded
from its request, so every image equals its solo run with the same seed.
`callback_on_step_end` runs after each denoising step: it ends requests canceled since
the last step at once (`drop_canceled`), and raises `Canceled` once none is left, which
stops the call. The rows of a canceled request run on to the end with the others (the
call's batch never changes size mid-loop: that would mean slicing the scheduler's private
state) and its images are discarded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

import torch
from PIL import Image

from jobs.schemas.image import ImageInput
from pipelines.base import Canceled, Request
from pipelines.image.load import Diffuser
from pipelines.image.output import latent_preview


@dataclass(eq=False)
class Share:
    """One request's part of a call: its prompts, one seed per image, its start image and
    mask."""

    request: Request[ImageInput]
    seeds: list[int]
    init_image: Image.Image | None = None
    mask_image: Image.Image | None = None
    live: bool = True

    @property
    def input(self) -> ImageInput:
        return self.request.input


@dataclass
class Generated:
    images: list[Image.Image] = field(default_factory=list)
    nsfw: list[bool] = field(default_factory=list)


@dataclass
class Preview:
    every_steps: int = 0
    max_side: int = 64


Tensors = dict[str, torch.Tensor]


class CallArgs(TypedDict, total=False):
    """The keyword arguments of one diffusers call (text-to-image, or image-to-image)."""

    prompt: list[str]
    negative_prompt: list[str] | None
    num_inference_steps: int
    guidance_scale: float
    generator: list[torch.Generator]
    callback_on_step_end: Callable[[Diffuser, int, torch.Tensor, Tensors], Tensors]
    callback_on_step_end_tensor_inputs: list[str]
    output_type: str
    width: int
    height: int
    image: list[Image.Image | None]
    mask_image: list[Image.Image | None]
    strength: float


class BatchCall:
    """Runs `shares` (same batch key) through `pipe` as one call."""

    def __init__(self, pipe: Diffuser, shares: list[Share], preview: Preview) -> None:
        self.pipe = pipe
        self.shares = shares
        self.preview = preview
        self.rows = [share for share in shares for _ in share.seeds]
        self.first_row = {share: self.rows.index(share) for share in shares}
        self.generators = [
            torch.Generator("cpu").manual_seed(seed) for share in shares for seed in share.seeds
        ]
        self._started = 0.0

    def run(self) -> dict[Share, Generated]:
        """Generated images of the requests still live at the end; raises `Canceled`."""
        self._started = time.monotonic()
        out = self.pipe(**self._kwargs())
        flags = out.nsfw_content_detected or [False] * len(out.images)
        result: dict[Share, Generated] = {}
        for share, image, flag in zip(self.rows, out.images, flags, strict=True):
            if share.live:
                generated = result.setdefault(share, Generated())
                generated.images.append(image)
                generated.nsfw.append(bool(flag))
        return result

    def _kwargs(self) -> CallArgs:
        first = self.shares[0].input
        negatives = [share.input.negative_prompt or "" for share in self.rows]
        kwargs: CallArgs = {
            "prompt": [share.input.prompt for share in self.rows],
            "negative_prompt": negatives if any(negatives) else None,
            "num_inference_steps": first.steps,
            "guidance_scale": first.guidance_scale,
            "generator": self.generators,
            "callback_on_step_end": self._on_step,
            "callback_on_step_end_tensor_inputs": self._tensor_inputs(),
            "output_type": "pil",
        }
        if first.mode == "txt2img":
            kwargs["width"], kwargs["height"] = first.width, first.height
        else:
            kwargs["image"] = [share.init_image for share in self.rows]
            kwargs["strength"] = first.strength
        if first.mode == "inpaint":
            kwargs["mask_image"] = [share.mask_image for share in self.rows]
            # The inpainting pipeline sizes its output by these, not by the image.
            kwargs["width"], kwargs["height"] = first.width, first.height
        return kwargs

    def _tensor_inputs(self) -> list[str]:
        """The latents, for previews, where the pipeline hands them to the callback."""
        return ["latents"] if "latents" in getattr(self.pipe, "_callback_tensor_inputs", []) else []

    # -- after each step -------------------------------------------------------------

    def _on_step(self, pipe: Diffuser, i: int, t: torch.Tensor, tensors: Tensors) -> Tensors:
        for share in self.shares:
            if share.live and share.request.drop_if_canceled():
                share.live = False
        if not any(share.live for share in self.shares):
            raise Canceled
        if i == 0:
            ms = (time.monotonic() - self._started) * 1000
            for share in self.shares:
                share.request.record_timing("first_step_ms", ms)
        total = int(getattr(pipe, "num_timesteps", 0) or self.shares[0].input.steps)
        self._report(i + 1, total, tensors.get("latents"))
        return {}

    def _report(self, step: int, total: int, latents: torch.Tensor | None) -> None:
        every = self.preview.every_steps
        want_preview = every > 0 and latents is not None and (step % every == 0 or step == total)
        for share in self.shares:
            if not share.live:
                continue
            extra: dict[str, str] = {}
            if want_preview and latents is not None:
                uri = latent_preview(latents[self.first_row[share]], self.preview.max_side)
                if uri is not None:
                    extra["preview"] = uri
            share.request.progress(step, total, **extra)
