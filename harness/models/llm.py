"""A Llama with random weights and a real byte-level BPE tokenizer, saved with
`save_pretrained`, so that `transformers serve` and `vllm serve` load it like any model
directory.

- `tiny` (tests, CPU): 2 layers of 128 (2 heads of 64, the smallest head vLLM's CPU
  attention takes, and 1 KV head), a BPE of 512 tokens trained on a few sentences.
- `tiny-llama3-vocab` (tests): the tiny model with `llama3-8b`'s tokenizer and output
  layer, to check them on a CPU.
- `llama3-8b` (GPUs): Llama-3-8B's shape (32 layers of 4096, GQA 32/8, 128256 tokens),
  bfloat16 (16 GB); the tokenizer is made up (`harness.models.bpe`) with Llama 3's
  vocabulary size. `layers` makes a shallower model of the same width for a smaller GPU.

Generation never ends early, so every request decodes exactly `max_tokens`: the tokenizer
names no end token (`</s>` is only a special token of its vocabulary) and neither do the
model's configs, so no engine stops on one (vLLM stops on the tokenizer's end token, which
a random model writes sooner or later); the large one's output layer also gives every byte
that could be half of a UTF-8 character a zero row, which a greedy decoder over 128k random
logits never picks.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.built import built_once
from harness.models.bpe import make_bpe, non_ascii_ids

if TYPE_CHECKING:
    import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, how are you today? Fine, thank you.",
    "Short prompts should never wait behind long ones.",
]
SPECIALS = ["<s>", "</s>", "<pad>"]
TRAINED_VOCAB_MAX = 4096
"""Vocabularies up to this size are trained on CORPUS; larger ones are made up."""


@dataclass(frozen=True)
class LlmShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    max_positions: int
    dtype: str
    rope_theta: float = 10000.0


SHAPES = {
    "tiny": LlmShape(512, 128, 256, 2, 2, 1, 4096, "float32"),
    "tiny-llama3-vocab": LlmShape(128256, 64, 128, 2, 4, 2, 4096, "float32", 500000.0),
    "llama3-8b": LlmShape(128256, 4096, 14336, 32, 32, 8, 8192, "bfloat16", 500000.0),
}


def build_llm(
    path: Path, size: str = "tiny", layers: int | None = None, device: str = "cpu"
) -> Path:
    """Write a random-weight Llama of shape `size` (`tiny`, `llama3-8b`) to `path`, with
    `layers` decoder layers if given; weights are made on `device` (a GPU is much
    faster for 8B). Returns `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SHAPES[size]
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(shape.vocab, shape.max_positions)
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=layers or shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        rope_theta=shape.rope_theta,  # type: ignore[call-arg]  # read from kwargs
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = getattr(torch, shape.dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    # Never end early: the tests and benches count tokens up to max_tokens.
    model.generation_config.eos_token_id = None
    if shape.vocab > TRAINED_VOCAB_MAX:
        never = [tokenizer.convert_tokens_to_ids(t) for t in SPECIALS] + non_ascii_ids()
        with torch.no_grad():
            model.lm_head.weight[never] = 0
    model.save_pretrained(path)
    return path


def _tokenizer(vocab: int, max_length: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab <= TRAINED_VOCAB_MAX:
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        bpe.train_from_iterator(CORPUS * 20, trainer)
    else:
        bpe = make_bpe(vocab - len(SPECIALS), SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token=None,  # see the module's docstring
        pad_token="<pad>",
        model_max_length=max_length,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_llm(path: Path) -> Path:
    return build_llm(path, "tiny")


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
