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

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import httpx
from rich.table import Table

from bench.common import percentile_ms, run_meta
from bench.embed import ENV, Level, console, merged, sentences
from tuning.deployment import private_deployment

DEFAULT_OUT = Path("bench/results/rerank-2026-11-27.json")


def pipeline_toml(name: str, model: str, device: str, max_batch: int, wait_ms: int) -> str:
    return (
        f'[pipelines.{name}]\nkind = "rerank"\nimpl = "pipelines.rerank:RerankPipeline"\n'
        f'model = {json.dumps(model)}\ndevice = "{device}"\nmax_batch = {max_batch}\n'
        f"max_wait_ms = {wait_ms}\nconcurrency = 64\n"
    )


def deploy(args: argparse.Namespace, stack: ExitStack) -> str:
    batched = pipeline_toml("batched", args.model, args.device, 32, 5)
    config = batched + pipeline_toml("alone", args.model, args.device, 1, 0)
    dep = stack.enter_context(
        private_deployment(config, ENV, [], "mmq-bench-rerank-", test_pipelines=False, reaper=False)
    )
    for name in ("batched", "alone"):
        dep.start_worker(name, wait=False)
    dep.wait_ready(timeout_s=300)
    return dep.base_url


async def level(url: str, target: str, concurrency: int, args: argparse.Namespace) -> Level:
    todo = iter(range(args.requests))
    latencies: list[float] = []
    failures = 0
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:

        async def lane() -> None:
            nonlocal failures
            for i in todo:
                query = sentences(1, 1000 + i)[0]
                body = {"model": target, "query": query, "documents": sentences(args.documents, i)}
                start = time.perf_counter()
                r = await http.post("/v1/rerank", json=body)
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures += 1

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Level(
        target, concurrency, args.requests, failures,
        round(len(latencies) * args.documents / wall, 1),
        round(percentile_ms(latencies, 50), 1), round(percentile_ms(latencies, 99), 1),
    )  # fmt: skip


async def measure(url: str, args: argparse.Namespace) -> list[Level]:
    warm = argparse.Namespace(**{**vars(args), "requests": 8})
    await level(url, "batched", 4, warm)
    await level(url, "alone", 4, warm)
    levels = []
    for concurrency in args.concurrency:
        for round_no in range(args.rounds):
            order = ("batched", "alone") if round_no % 2 == 0 else ("alone", "batched")
            for target in order:
                levels.append(await level(url, target, concurrency, args))
                console.print(levels[-1])
    return levels


def report(rows: list[Level]) -> dict[str, float]:
    table = Table(title="Rerank through the service: batched across requests vs alone")
    for col in ("target", "concurrency", "documents/s", "p50 ms", "p99 ms", "failures"):
        table.add_column(col, justify="right")
    for lv in rows:
        table.add_row(
            lv.target, str(lv.concurrency), f"{lv.texts_per_s:,.1f}",
            f"{lv.p50_ms:.1f}", f"{lv.p99_ms:.1f}", str(lv.failures),
        )  # fmt: skip
    console.print(table)
    ratios = {}
    for concurrency in sorted({lv.concurrency for lv in rows}):
        b = next(lv for lv in rows if lv.target == "batched" and lv.concurrency == concurrency)
        a = next(lv for lv in rows if lv.target == "alone" and lv.concurrency == concurrency)
        ratios[f"batched_over_alone_c{concurrency}"] = round(b.texts_per_s / a.texts_per_s, 2)
    console.print(f"batched / alone (documents/s): {ratios}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rerank", description=__doc__)
    parser.add_argument("--model", default="", help="empty: a random MiniLM-L6 cross-encoder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--documents", type=int, default=8)
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[32]
    )
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        if not args.model:
            from harness.models.reranker import build_reranker

            built = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-reranker-")))
            args.model = str(build_reranker(built, "minilm"))
        url = deploy(args, stack)
        levels = asyncio.run(measure(url, args))
        rows = merged(levels)
        ratios = report(rows)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        model = (
            "random ms-marco-MiniLM-L6-v2 shape" if "mmq-reranker-" in args.model else args.model
        )
        result = {
            "meta": run_meta(**{k: str(v) for k, v in vars(args).items()}, model_is=model),
            "levels": [asdict(lv) for lv in levels],
            "rows": [asdict(lv) for lv in rows],
            "ratios": ratios,
        }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
