"""A LoRA adapter with random weights for the tiny Llama (`harness.models.llm`), written in
PEFT's format (`adapter_config.json`, `adapter_model.safetensors`), so that vLLM loads it
like any adapter (`--lora-modules NAME=PATH`, `/v1/load_lora_adapter`).

It adapts every attention projection of every layer with rank `RANK` and weights large
enough that, at temperature 0, the adapted model's answer differs from the base model's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.built import built_once

if TYPE_CHECKING:
    import pytest

RANK = 8
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def build_lora(base: Path, path: Path, seed: int = 0) -> Path:
    """Write an adapter of `base` (a Llama directory) to `path`; returns `path`."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv),
              "v_proj": (hidden, kv), "o_proj": (heads * head_dim, hidden)}  # fmt: skip
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            fan_in, fan_out = shapes[target]
            key = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            weights[f"{key}.lora_A.weight"] = torch.randn(RANK, fan_in, generator=generator)
            weights[f"{key}.lora_B.weight"] = torch.randn(fan_out, RANK, generator=generator)
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(TARGETS),
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter, indent=2))
    return path


def cached_lora(tmp_path_factory: pytest.TempPathFactory, base: Path, seed: int = 0) -> Path:
    """The adapter of `base` made with `seed`, built on first use (kept across runs, under
    a name of the base's path too: its config names it)."""
    of_base = hashlib.sha256(str(base).encode()).hexdigest()[:8]
    return built_once(
        tmp_path_factory, f"lora-{seed}-{of_base}", "adapter_model.safetensors",
        lambda path: build_lora(base, path, seed),
    )  # fmt: skip
