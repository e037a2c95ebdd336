"""A tiny Llama with random weights and a real byte-level BPE tokenizer, saved with
`save_pretrained`, so that `transformers serve` loads it like any model directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.built import built_once

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, how are you today? Fine, thank you.",
    "Short prompts should never wait behind long ones.",
]


def build_tiny_llm(path: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # Never end early: the tests count tokens up to max_tokens.
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    return path


def cached_tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model of this test session, built on first use."""
    return built_once(tmp_path_factory, "tiny-llm", "model.safetensors", build_tiny_llm)


def tiny_llm_claiming(model: Path, path: Path, max_positions: int) -> Path:
    """A copy of the tiny model whose config.json claims `max_positions` tokens of
    context (its KV cache per token stays tiny)."""
    shutil.copytree(model, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = max_positions
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
