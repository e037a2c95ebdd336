"""Rerank: requests batched across clients vs one at a time, through the service, in one run.

    python -m bench.rerank [--model DIR|HUB_ID] [--device cpu|gpu:0] [--documents 8]
                           [--concurrency 32] [--requests 96] [--rounds 2]
                           [--out bench/results/rerank-2026-11-27.json]

It starts Redis, the API and two rerank workers of the same cross-encoder on free ports:
`batched` (`max_batch` 32, `max_wait_ms` 5: the query-document pairs of every request
waiting are scored together) and `alone` (`max_batch` 1: each request's pairs by
themselves). At each concurrency (closed loops of `POST /v1/rerank`, a query and
`--documents` documents a request) it sends `--requests` to each, taking turns
(`--rounds`), and reports documents/s and p50/p99 latency, and batched / alone.

No package ships a cross-encoder: without `--model` it builds one with random weights in
the shape of cross-encoder/ms-marco-MiniLM-L6-v2 (6 layers of 384; `harness.models.reranker`),
which costs what the real one costs (its scores mean nothing; the bench reads none).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.batching_bench import Route, arguments, deploy, measure, merged, report, sentences, write
from bench.common import run_meta

DEFAULT_OUT = Path("bench/results/rerank-2026-11-27.json")


def route(url: str, documents: int) -> Route:
    """`POST /v1/rerank` of a query and `documents` documents a request."""

    def body(target: str, i: int) -> dict[str, Any]:
        query = sentences(1, 1000 + i)[0]
        return {"model": target, "query": query, "documents": sentences(documents, i)}

    return Route(url, "/v1/rerank", body, items=documents)


def main(argv: list[str] | None = None) -> int:
    args = arguments(
        "python -m bench.rerank",
        __doc__,
        model_help="empty: a random MiniLM-L6 cross-encoder",
        items="documents",
        concurrency=[32],
        requests=96,
        out=DEFAULT_OUT,
    ).parse_args(argv)
    with ExitStack() as stack:
        if not args.model:
            from harness.models.reranker import build_reranker

            built = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-reranker-")))
            args.model = str(build_reranker(built, "minilm"))
        url = deploy(stack, "rerank", "pipelines.rerank:RerankPipeline", args.model, args.device)
        levels = asyncio.run(
            measure(route(url, args.documents), args.concurrency, args.requests, args.rounds)
        )
    rows = merged(levels)
    title = "Rerank through the service: batched across requests vs alone"
    ratios = report(title, "documents", rows)
    model = "random ms-marco-MiniLM-L6-v2 shape" if "mmq-reranker-" in args.model else args.model
    write(
        args.out,
        {
            "meta": run_meta(**{k: str(v) for k, v in vars(args).items()}, model_is=model),
            "levels": [asdict(lv) for lv in levels],
            "rows": [asdict(lv) for lv in rows],
            "ratios": ratios,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
