"""Reranking with a sentence-transformers `CrossEncoder`, batched across requests.

`model` is a cross-encoder (a hub id from the local hub cache, or a local directory:
`cross-encoder/ms-marco-MiniLM-L6-v2`, `BAAI/bge-reranker-base`...); no package ships one,
so a rerank pipeline needs it named. The model reads each (query, document) pair and gives
it a relevance score (its one label through a sigmoid: 0 to 1). Every pair of every
request of a batch is scored in one `predict` call (in forward passes of
`options.predict_batch` pairs), so many small requests cost a few large passes.

`prepare` counts each pair's tokens (the query once): a query that fills the window alone
is refused (422 naming `query`), a pair longer than the window too (422 naming
`documents.N`) unless `options.truncate_input`, where the pair is cut to fit (the
longer of the two first). A request's output holds its results from the most relevant
document to the least (`top_n` of them), each with its index in the request, and the
tokens the model read.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from jobs.errors import InputError
from jobs.outputs import RerankOutput, RerankResult
from jobs.schemas.rerank import RerankInput, RerankOptions
from jobs.settings import on_gpu
from pipelines.base import Pipeline, Request


@dataclass
class Pairs:
    """A request ready to score: how many tokens each (query, document) pair has."""

    request: Request[RerankInput]
    tokens: list[int]


def ranked(scores: np.ndarray, inp: RerankInput) -> list[RerankResult]:
    """The results from the highest score to the lowest (the earlier document first on a
    tie), the first `top_n` of them."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    results: list[RerankResult] = []
    for i in order[: inp.top_n]:
        result: RerankResult = {"index": i, "relevance_score": float(scores[i])}
        if inp.return_documents:
            result["document"] = {"text": inp.documents[i]}
        results.append(result)
    return results


class RerankPipeline(Pipeline[RerankInput, Pairs]):
    kind = "rerank"

    def load(self) -> None:
        from sentence_transformers import CrossEncoder
        from transformers.utils import logging as transformers_logging

        self.options = self.config.options_as(RerankOptions)
        if not self.config.model:
            raise RuntimeError(
                "a rerank pipeline needs a cross-encoder: set [pipelines.NAME] model to a "
                "hub id in the local cache or a directory"
            )
        device = "cuda" if on_gpu(self.config.device) else "cpu"
        # Its load bars are noise in a worker's log (the function has no type hints).
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        self.model = CrossEncoder(self.config.model, device=device)
        self.window = int(self.model.max_seq_length or 512)
        # The special tokens a (query, document) pair adds: [CLS] q [SEP] d [SEP].
        self._pair_extra = int(self.model.tokenizer.num_special_tokens_to_add(pair=True))

    def warmup(self) -> None:
        self.model.predict([("warm up", "a document")], show_progress_bar=False)

    def batch_key(self, request: RerankInput) -> Hashable | None:
        return "rerank"  # any requests batch: the predict call takes their pairs together

    def prepare(self, request: Request[RerankInput]) -> Pairs:
        inp = request.input
        query = self._token_count(inp.query)
        if not self.options.truncate_input and query + self._pair_extra >= self.window:
            raise InputError(
                "query",
                f"{query} tokens leave no room for a document in the model's window of "
                f"{self.window}",
            )
        tokens = [query + self._pair_extra + n for n in self._token_counts(inp.documents)]
        if not self.options.truncate_input:
            for i, count in enumerate(tokens):
                if count > self.window:
                    raise InputError(
                        f"documents.{i}",
                        f"{count} tokens with the query is over the model's window of "
                        f"{self.window}",
                    )
        return Pairs(request, [min(count, self.window) for count in tokens])

    def run(self, batch: Sequence[Pairs]) -> None:
        pairs = [
            (item.request.input.query, doc)
            for item in batch
            for doc in item.request.input.documents
        ]
        scores = self.model.predict(
            pairs,
            batch_size=self.options.predict_batch,
            convert_to_numpy=True,
            show_progress_bar=False,  # a bar a batch (at log level INFO) is noise in a log
        )
        start = 0
        for item in batch:
            count = len(item.request.input.documents)
            mine, start = scores[start : start + count], start + count
            if not item.request.drop_if_canceled():
                item.request.succeed(self._output(item, np.asarray(mine)))

    def _output(self, item: Pairs, scores: np.ndarray) -> RerankOutput:
        used = sum(item.tokens)
        return {
            "results": ranked(scores, item.request.input),
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }

    def _token_count(self, text: str) -> int:
        return self._token_counts([text])[0]

    def _token_counts(self, texts: list[str]) -> list[int]:
        """Each text's tokens, without the special ones: a pair's count is its query's
        plus its document's plus `_pair_extra`, so the query is tokenized once a request,
        not once a document (issue 65: a long query with 1,000 documents held a worker)."""
        ids = self.model.tokenizer(texts, add_special_tokens=False, truncation=False)
        return [len(one) for one in ids["input_ids"]]

    def unload(self) -> None:
        del self.model
