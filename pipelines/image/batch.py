"""One diffusers call for a batch of requests: per-image prompts and generators, progress,
and cancel between steps.

Each image is one row of the call's batch tensor, with its own `torch.Generator` seeded
from its request, so every image equals its solo run with the same seed.
`callback_on_step_end` runs after each denoising step: it ends requests canceled since
the last step at once (`drop_canceled`), and raises `Canceled` once none is left, which
stops the call. Where the pipeline's loop allows it (Stable Diffusion text-to-image and
image-to-image), the canceled rows also leave the batch: the callback slices the latents,
the prompt embeddings, the scheduler's per-sample history and the generator list, so the
others go on with a smaller batch and the same result. Elsewhere the rows run to the end
and their images are discarded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from jobs.schemas.image import ImageInput
from pipelines.base import Canceled, Request
from pipelines.image.load import Diffuser
from pipelines.image.output import latent_preview

SHRINKABLE = frozenset({"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"})
"""Pipelines whose denoising loop keeps no per-row state beyond what the callback sees."""
SCHEDULER_STATE = (
    "ets",
    "cur_sample",
    "cur_model_output",
    "derivatives",
    "prev_derivative",
    "sample",
    "model_outputs",
    "last_sample",
)
"""Per-sample history of multistep schedulers (PNDM, LMS, Heun, DPM-Solver, UniPC)."""
SHRINK_TENSORS = ["latents", "prompt_embeds", "negative_prompt_embeds"]


@dataclass(eq=False)
class Share:
    """One request's part of a call: its prompts, one seed per image, its start image."""

    request: Request
    seeds: list[int]
    init_image: Image.Image | None = None
    live: bool = True

    @property
    def input(self) -> ImageInput:
        inp = self.request.input
        assert isinstance(inp, ImageInput)
        return inp


@dataclass
class Generated:
    images: list[Image.Image] = field(default_factory=list)
    nsfw: list[bool] = field(default_factory=list)


@dataclass
class Preview:
    every_steps: int = 0
    max_side: int = 64


class BatchCall:
    """Runs `shares` (same batch key) through `pipe` as one call."""

    def __init__(self, pipe: Diffuser, shares: list[Share], preview: Preview) -> None:
        self.pipe = pipe
        self.shares = shares
        self.preview = preview
        self.rows = [share for share in shares for _ in share.seeds]
        self.generators = [
            torch.Generator("cpu").manual_seed(seed) for share in shares for seed in share.seeds
        ]
        self.shrinkable = (
            type(pipe).__name__ in SHRINKABLE and pipe.unet.config.time_cond_proj_dim is None
        )

    def run(self) -> dict[Share, Generated]:
        """Generated images of the requests still live at the end; raises `Canceled`."""
        out = self.pipe(**self._kwargs())
        flags = out.nsfw_content_detected or [False] * len(out.images)
        result: dict[Share, Generated] = {}
        for share, image, flag in zip(self.rows, out.images, flags, strict=True):
            if share.live:
                generated = result.setdefault(share, Generated())
                generated.images.append(image)
                generated.nsfw.append(bool(flag))
        return result

    def _kwargs(self) -> dict[str, Any]:
        first = self.shares[0].input
        negatives = [share.input.negative_prompt or "" for share in self.rows]
        kwargs: dict[str, Any] = {
            "prompt": [share.input.prompt for share in self.rows],
            "negative_prompt": negatives if any(negatives) else None,
            "num_inference_steps": first.steps,
            "guidance_scale": first.guidance_scale,
            "generator": self.generators,
            "callback_on_step_end": self._on_step,
            "callback_on_step_end_tensor_inputs": self._tensor_inputs(),
            "output_type": "pil",
        }
        if first.init_image is None:
            kwargs.update(width=first.width, height=first.height)
        else:
            kwargs.update(image=[share.init_image for share in self.rows], strength=first.strength)
        return kwargs

    def _tensor_inputs(self) -> list[str]:
        allowed = set(getattr(self.pipe, "_callback_tensor_inputs", []))
        wanted = SHRINK_TENSORS if self.shrinkable else ["latents"]
        return [name for name in wanted if name in allowed]

    # -- after each step -------------------------------------------------------------

    def _on_step(self, pipe: Diffuser, i: int, t: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        dropped = self._drop_canceled()
        if not any(share.live for share in self.shares):
            raise Canceled
        changed = self._shrink(tensors) if dropped and self.shrinkable else {}
        total = int(getattr(pipe, "num_timesteps", 0) or self.shares[0].input.steps)
        self._report(i + 1, total, {**tensors, **changed}.get("latents"))
        return changed

    def _drop_canceled(self) -> bool:
        dropped = False
        for share in self.shares:
            if share.live and share.request.cancelled():
                share.live = False
                share.request.drop_canceled()
                dropped = True
        return dropped

    def _shrink(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Keep only the live rows in every tensor that carries one per image."""
        old = len(self.rows)
        keep = [j for j, share in enumerate(self.rows) if share.live]
        index = torch.tensor(keep, device=tensors["latents"].device)
        changed = {
            name: select_rows(value, index, old)
            for name, value in tensors.items()
            if isinstance(value, torch.Tensor)
        }
        for name in SCHEDULER_STATE:
            value = getattr(self.pipe.scheduler, name, None)
            if value is not None:
                setattr(self.pipe.scheduler, name, select_rows(value, index, old))
        # The pipeline holds this very list (its scheduler steps draw noise from it).
        self.generators[:] = [self.generators[j] for j in keep]
        self.rows = [self.rows[j] for j in keep]
        return changed

    def _report(self, step: int, total: int, latents: torch.Tensor | None) -> None:
        every = self.preview.every_steps
        want_preview = every > 0 and latents is not None and (step % every == 0 or step == total)
        first_row: dict[Share, int] = {}
        for j, share in enumerate(self.rows):
            first_row.setdefault(share, j)
        for share in self.shares:
            if not share.live:
                continue
            extra: dict[str, Any] = {}
            if want_preview and latents is not None:
                uri = latent_preview(latents[first_row[share]], self.preview.max_side)
                if uri is not None:
                    extra["preview"] = uri
            share.request.progress(step, total, **extra)


def select_rows(value: Any, index: torch.Tensor, rows: int) -> Any:
    """`value` with only the rows in `index`: a tensor of `rows` rows (or of 2x`rows`,
    the unconditional and conditional halves of classifier-free guidance), or a list of
    them; anything else as it is."""
    if isinstance(value, list):
        return [select_rows(item, index, rows) for item in value]
    if not isinstance(value, torch.Tensor) or value.ndim == 0:
        return value
    index = index.to(value.device)
    if value.shape[0] == rows:
        return value.index_select(0, index)
    if value.shape[0] == 2 * rows:
        return torch.cat([value[:rows].index_select(0, index), value[rows:].index_select(0, index)])
    return value
