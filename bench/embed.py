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
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from tuning.deployment import private_deployment

console = Console(width=140)
DEFAULT_OUT = Path("bench/results/embed.json")
GOAL_RATIO = 1.5
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1", "MMQ_LOG_LEVEL": "WARNING"}
"""No keys; WARNING, not the harness's INFO: no log line per task on the measured path
(readiness is `/readyz`, not the workers' logs)."""
WORDS = "the quick brown fox jumps over a lazy dog near the river bank at dawn".split()  # noqa: SIM905


@dataclass
class Level:
    target: str
    concurrency: int
    requests: int
    failures: int
    texts_per_s: float
    p50_ms: float
    p99_ms: float


def sentences(count: int, start: int) -> list[str]:
    return [" ".join(WORDS[(start + i + j) % len(WORDS)] for j in range(12)) for i in range(count)]


def pipeline_toml(name: str, model: str, device: str, max_batch: int, wait_ms: int) -> str:
    return (
        f'[pipelines.{name}]\nkind = "embed"\nimpl = "pipelines.embed:EmbedPipeline"\n'
        f'model = {json.dumps(model)}\ndevice = "{device}"\nmax_batch = {max_batch}\n'
        f"max_wait_ms = {wait_ms}\nconcurrency = 64\n"
    )


def deploy(args: argparse.Namespace, stack: ExitStack) -> str:
    batched = pipeline_toml("batched", args.model, args.device, 32, 5)
    config = batched + pipeline_toml("alone", args.model, args.device, 1, 0)
    dep = stack.enter_context(
        private_deployment(config, ENV, [], "mmq-bench-embed-", test_pipelines=False, reaper=False)
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
                body = {"model": target, "input": sentences(args.texts, i)}
                start = time.perf_counter()
                r = await http.post("/v1/embeddings", json=body)
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures += 1

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return Level(
        target, concurrency, args.requests, failures,
        round(len(latencies) * args.texts / wall, 1),
        round(percentile_ms(latencies, 50), 1), round(percentile_ms(latencies, 99), 1),
    )  # fmt: skip


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
    return Level(
        "in process", 1, args.requests, 0, round(args.requests * args.texts / wall, 1),
        round(percentile_ms(latencies, 50), 1), round(percentile_ms(latencies, 99), 1),
    )  # fmt: skip


async def measure(url: str, args: argparse.Namespace) -> list[Level]:
    await level(url, "batched", 4, argparse.Namespace(**{**vars(args), "requests": 8}))
    await level(url, "alone", 4, argparse.Namespace(**{**vars(args), "requests": 8}))
    levels = []
    for concurrency in args.concurrency:
        for round_no in range(args.rounds):
            order = ("batched", "alone") if round_no % 2 == 0 else ("alone", "batched")
            for target in order:
                levels.append(await level(url, target, concurrency, args))
                console.print(levels[-1])
    return levels


def merged(levels: list[Level]) -> list[Level]:
    """One row per target and concurrency over its rounds: the mean texts/s and p50, the
    worst p99."""
    out: dict[tuple[str, int], list[Level]] = {}
    for lv in levels:
        out.setdefault((lv.target, lv.concurrency), []).append(lv)
    rows = []
    for (target, concurrency), group in out.items():
        n = len(group)
        rows.append(
            Level(
                target=target,
                concurrency=concurrency,
                requests=sum(g.requests for g in group),
                failures=sum(g.failures for g in group),
                texts_per_s=round(sum(g.texts_per_s for g in group) / n, 1),
                p50_ms=round(sum(g.p50_ms for g in group) / n, 1),
                p99_ms=max(g.p99_ms for g in group),
            )
        )
    return rows


def report(rows: list[Level], direct: Level) -> dict[str, float]:
    table = Table(title="Embeddings through the service: batched across requests vs alone")
    for col in ("target", "concurrency", "texts/s", "p50 ms", "p99 ms", "failures"):
        table.add_column(col, justify="right")
    for lv in [*rows, direct]:
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
    console.print(f"batched / alone (texts/s): {ratios}; goal >= {GOAL_RATIO}x at the highest")
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__)
    parser.add_argument("--model", default="", help="empty: the packaged all-MiniLM-L6-v2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--texts", type=int, default=8)
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        url = deploy(args, stack)
        levels = asyncio.run(measure(url, args))
    direct = in_process(args)
    rows = merged(levels)
    ratios = report(rows, direct)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "meta": run_meta(**{k: str(v) for k, v in vars(args).items()}),
        "levels": [asdict(lv) for lv in levels],
        "rows": [asdict(lv) for lv in rows],
        "in_process": asdict(direct),
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
