"""Stable Diffusion with random weights, built from configs and saved to a directory.

`build_sd(path, size)` writes a full diffusers model folder (model_index.json, unet, vae,
text_encoder, tokenizer, scheduler) that `AutoPipelineForText2Image.from_pretrained(path)`
loads like any hub model: the same code path users take, with no download.

- `tiny` (tests, CPU): a small UNet, VAE and text encoder. The VAE has four blocks (a
  scale factor of 8, like SD 1.5), so a 64x64 image is an 8x8 latent.
- `sd15` (GPUs): SD 1.5's architecture from its published configs (UNet 860M, VAE 84M,
  CLIP ViT-L/14 text encoder 123M), saved as float16 (2 GB): the real model's compute
  and memory, no download. The images are noise; the timings are representative.

The tokenizer is a byte-level BPE with no merges: its vocab is the byte-level alphabet,
each symbol plain and with `</w>`, plus the two special tokens. `model_max_length` must be
given, or it is 1e30 and the pipeline's padding breaks.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from harness.built import built_once

if TYPE_CHECKING:
    import pytest

TINY_SIZE = 64
"""Native image side of the tiny model (unet sample_size x the VAE's scale factor)."""
TEXT_HIDDEN = 32
MAX_LENGTH = 77
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def write_tokenizer(path: Path) -> None:
    """A CLIPTokenizer folder: vocab.json, merges.txt and its config."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import CLIPTokenizer

    alphabet = sorted(ByteLevel.alphabet())
    symbols = [*alphabet, *(s + "</w>" for s in alphabet), BOS, EOS]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.json").write_text(json.dumps({s: i for i, s in enumerate(symbols)}))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(
        str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=MAX_LENGTH
    )
    tokenizer.save_pretrained(str(path))


class UnetShape(TypedDict, total=False):
    """Keyword arguments of diffusers' `UNet2DConditionModel` that a shape sets."""

    sample_size: int
    layers_per_block: int
    block_out_channels: tuple[int, ...]
    down_block_types: tuple[str, ...]
    up_block_types: tuple[str, ...]
    cross_attention_dim: int
    attention_head_dim: int
    norm_num_groups: int


class VaeShape(TypedDict, total=False):
    """Keyword arguments of diffusers' `AutoencoderKL` that a shape sets."""

    block_out_channels: tuple[int, ...]
    layers_per_block: int
    norm_num_groups: int
    sample_size: int


class TextShape(TypedDict, total=False):
    """Keyword arguments of transformers' `CLIPTextConfig` that a shape sets."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    hidden_act: str
    projection_dim: int


@dataclass(frozen=True)
class SdShape:
    """Keyword arguments of the UNet, the VAE and the CLIP text config."""

    unet: UnetShape
    vae: VaeShape
    text: TextShape
    half: bool


SHAPES = {
    "tiny": SdShape(
        unet={
            "sample_size": TINY_SIZE // 8,
            "layers_per_block": 1,
            "block_out_channels": (32, 64),
            "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
            "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
            "cross_attention_dim": TEXT_HIDDEN,
            "attention_head_dim": 8,
            "norm_num_groups": 16,
        },
        vae={
            "block_out_channels": (16, 16, 16, 16),
            "layers_per_block": 1,
            "norm_num_groups": 8,
            "sample_size": TINY_SIZE,
        },
        text={
            "vocab_size": 1000,
            "hidden_size": TEXT_HIDDEN,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
        },
        half=False,
    ),
    "sd15": SdShape(
        unet={
            "sample_size": 64,
            "cross_attention_dim": 768,
            "attention_head_dim": 8,
            "block_out_channels": (320, 640, 1280, 1280),
            "layers_per_block": 2,
        },
        vae={
            "block_out_channels": (128, 256, 512, 512),
            "layers_per_block": 2,
            "sample_size": 512,
        },
        text={
            "vocab_size": 49408,
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "hidden_act": "quick_gelu",
            "projection_dim": 768,
        },
        half=True,
    ),
}


def build_sd(path: Path, size: str = "tiny", seed: int = 0, device: str = "cpu") -> Path:
    """Write a random-weight Stable Diffusion of shape `size` (`tiny`, `sd15`) to `path`;
    its weights are made on `device` (a GPU is faster for sd15). Returns `path`."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig

    shape = SHAPES[size]
    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel(in_channels=4, out_channels=4, **shape.unet)
        vae = AutoencoderKL(
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            latent_channels=4,
            **shape.vae,
        )
    return _save(path, unet, vae, CLIPTextConfig(**shape.text), half=shape.half, device=device)


def build_tiny_sd(path: Path) -> Path:
    return build_sd(path, "tiny")


def _save(path: Path, unet: Any, vae: Any, text: Any, half: bool, device: str) -> Path:
    import torch
    from diffusers import PNDMScheduler, StableDiffusionPipeline
    from transformers import CLIPTextModel, CLIPTokenizer

    write_tokenizer(path / "tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(str(path / "tokenizer"))
    text.vocab_size = max(text.vocab_size, len(tokenizer))
    text.max_position_embeddings = MAX_LENGTH
    text.bos_token_id, text.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    text.pad_token_id = tokenizer.pad_token_id
    # SD 1.5's own scheduler settings, so requests without `scheduler` run as on the real model.
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        skip_prk_steps=True,
        steps_offset=1,
        set_alpha_to_one=False,
    )
    with torch.device(device):
        text_encoder = CLIPTextModel(text)
    pipe: Any = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    if half:
        pipe.to(torch.float16)
    pipe.save_pretrained(str(path))
    return path


def cached_tiny_sd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model of this test session, built on first use."""
    return built_once(tmp_path_factory, "tiny-sd", "model_index.json", build_tiny_sd)


@contextlib.contextmanager
def offline_hub() -> Iterator[None]:
    """No hub access from this process (HF_HUB_OFFLINE=1), as in the workers of the tests."""
    import huggingface_hub.constants
    import pytest

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield
