"""Embeddings: requests batched across clients vs one at a time, through the service, in one
run; and sentence-transformers in process beside them.

    python -m bench.embed [--model DIR|HUB_ID] [--device cpu|gpu:0] [--texts 8]
                          [--concurrency 1,8,32] [--requests 64] [--rounds 2]
                          [--out bench/results/embed.json]

It starts Redis, the API and two embed workers of the same model on free ports: `batched`
(`max_batch` 32, `max_wait_ms` 5: the texts of every request waiting are encoded
together) and `alone` (`max_batch` 1: each request's texts by themselves). At each
concurrency (closed loops of `POST /v1/embeddings`, `--texts` sentences a request) it
sends `--requests` to each, taking turns (`--rounds`), and reports texts/s and p50/p99
latency, and batched / alone. `in process` calls the model in this process one request at
a time (what the service adds to a lone request). Goal: batched >= 1.5x alone at the
highest concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.batching_bench import (
    Level,
    Route,
    arguments,
    deploy,
    measure,
    merged,
    report,
    sentences,
    summary,
    write,
)
from bench.common import run_meta

DEFAULT_OUT = Path("bench/results/embed.json")
GOAL_RATIO = 1.5


def route(url: str, texts: int) -> Route:
    """`POST /v1/embeddings` of `texts` sentences a request."""

    def body(target: str, i: int) -> dict[str, Any]:
        return {"model": target, "input": sentences(texts, i)}

    return Route(url, "/v1/embeddings", body, items=texts)


def in_process(args: argparse.Namespace) -> Level:
    """The model called here, one request at a time."""
    from sentence_transformers import SentenceTransformer

    from pipelines.embed import default_model_dir

    model = SentenceTransformer(args.model or str(default_model_dir()), device="cpu")
    model.encode(sentences(args.texts, 0))
    latencies = []
    start = time.perf_counter()
    for i in range(args.requests):
        t = time.perf_counter()
        model.encode(sentences(args.texts, i), normalize_embeddings=True)
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return summary("in process", 1, args.requests, args.requests * args.texts, wall, latencies)


def main(argv: list[str] | None = None) -> int:
    args = arguments(
        "python -m bench.embed",
        __doc__,
        model_help="empty: the packaged all-MiniLM-L6-v2",
        items="texts",
        concurrency=[1, 8, 32],
        requests=64,
        out=DEFAULT_OUT,
    ).parse_args(argv)
    with ExitStack() as stack:
        url = deploy(stack, "embed", "pipelines.embed:EmbedPipeline", args.model, args.device)
        levels = asyncio.run(
            measure(route(url, args.texts), args.concurrency, args.requests, args.rounds)
        )
    direct = in_process(args)
    rows = merged(levels)
    title = "Embeddings through the service: batched across requests vs alone"
    goal = f"; goal >= {GOAL_RATIO}x at the highest"
    ratios = report(title, "texts", rows, extra=[direct], note=goal)
    write(
        args.out,
        {
            "meta": run_meta(**{k: str(v) for k, v in vars(args).items()}),
            "levels": [asdict(lv) for lv in levels],
            "rows": [asdict(lv) for lv in rows],
            "in_process": asdict(direct),
            "ratios": ratios,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
