"""Loading a diffusers model: options, device and dtype, speed switches, schedulers.

`AutoPipelineForText2Image.from_pretrained(model)` takes a hub id (from the local hub
cache when `HF_HUB_OFFLINE=1`) or a local directory written by `save_pretrained`; the
image-to-image and inpainting pipelines share its modules (`from_pipe`: no second load)
where the model family has them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypedDict

import diffusers
import torch
from diffusers import (
    AutoPipelineForImage2Image,
    AutoPipelineForInpainting,
    AutoPipelineForText2Image,
)

from jobs.schemas.image import SCHEDULERS, ImageOptions
from jobs.settings import PipelineConfig

log = logging.getLogger(__name__)

Diffuser = Any
"""A diffusers pipeline: its modules (unet, vae, scheduler...) are dynamic attributes."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def torch_device(device: str) -> torch.device:
    """The torch device of a config's `device`: cpu, cuda[:N], gpu[:N] or mig:UUID.

    The launcher makes a worker's GPU or MIG slice the only visible device, so `gpu:N`
    means cuda:N only where more than N devices are visible, and a MIG slice is cuda:0.
    """
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return torch.device("cpu")
    if kind not in {"cuda", "gpu", "mig"}:
        raise ValueError(f"unknown device {device!r}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")
    if kind != "mig" and index.isdigit() and int(index) < torch.cuda.device_count():
        return torch.device("cuda", int(index))
    return torch.device("cuda", 0)


def torch_dtype(opts: ImageOptions, device: torch.device) -> torch.dtype:
    if opts.dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[opts.dtype]


@dataclass
class Loaded:
    text2img: Diffuser
    img2img: Diffuser | None
    inpaint: Diffuser | None
    device: torch.device
    dtype: torch.dtype
    scheduler_cls: Any
    """The model's own scheduler class, with its config below."""
    scheduler_config: Any

    def scheduler(self, name: str | None) -> Any:
        """A fresh scheduler: `name` from SCHEDULERS, or the model's own when None."""
        if name is None:
            return self.scheduler_cls.from_config(self.scheduler_config)
        spec = SCHEDULERS[name]
        cls = getattr(diffusers, spec.cls)
        return cls.from_config(self.scheduler_config, **spec.kwargs)


class PretrainedArgs(TypedDict, total=False):
    """What `from_pretrained` is told beside the model."""

    dtype: torch.dtype
    variant: str
    safety_checker: None
    """None: no safety checker."""


def load_model(config: PipelineConfig, opts: ImageOptions, max_side: int) -> Loaded:
    """Load `config.model` (a hub id or a local directory) with the options applied."""
    if not config.model:
        raise ValueError("an image pipeline needs `model`: a hub id or a local directory")
    device = torch_device(config.device)
    dtype = torch_dtype(opts, device)
    kwargs: PretrainedArgs = {"dtype": dtype}
    if opts.variant:
        kwargs["variant"] = opts.variant
    if not opts.safety_checker:
        kwargs["safety_checker"] = None
    loader: Any = AutoPipelineForText2Image
    pipe = loader.from_pretrained(config.model, **kwargs)
    if device.type != "cpu":
        pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    apply_speed_switches(pipe, opts, device, max_side)
    scheduler = pipe.scheduler
    return Loaded(
        pipe,
        sharing(pipe, AutoPipelineForImage2Image, dtype) if opts.img2img else None,
        sharing(pipe, AutoPipelineForInpainting, dtype) if opts.inpaint else None,
        device,
        dtype,
        type(scheduler),
        scheduler.config,
    )


def sharing(pipe: Diffuser, auto: Any, dtype: torch.dtype) -> Diffuser | None:
    """The family's pipeline of the `auto` class (image-to-image, inpainting) over the
    modules of `pipe`; None where the family has none."""
    try:
        # from_pipe casts the shared modules to `dtype` (float32 unless told).
        other = auto.from_pipe(pipe, dtype=dtype)
    except (ValueError, KeyError) as exc:
        log.info("no %s pipeline for %s: %s", auto.__name__, type(pipe).__name__, exc)
        return None
    other.set_progress_bar_config(disable=True)
    return other


def denoiser(pipe: Diffuser) -> Any:
    """The model that runs every step: a UNet, or a transformer (SD3, Flux...)."""
    return getattr(pipe, "unet", None) or pipe.transformer


def native_side(pipe: Diffuser) -> int:
    """The image side the model was trained at (sample size x VAE scale factor)."""
    sample = getattr(denoiser(pipe).config, "sample_size", None) or 64
    side = sample if isinstance(sample, int) else max(sample)
    return int(side * pipe.vae_scale_factor)


def apply_speed_switches(
    pipe: Diffuser, opts: ImageOptions, device: torch.device, max_side: int
) -> None:
    on_cuda = device.type == "cuda"
    if opts.attention_slicing:
        pipe.enable_attention_slicing()
    if opts.channels_last is True or (opts.channels_last == "auto" and on_cuda):
        denoiser(pipe).to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if opts.vae_tiling is True or (opts.vae_tiling == "auto" and max_side > native_side(pipe)):
        pipe.vae.enable_tiling()
    if opts.vae_slicing:
        pipe.vae.enable_slicing()
    if opts.compile:
        denoiser(pipe).compile(mode=opts.compile_mode)
