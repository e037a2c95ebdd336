"""What `bench.embed` and `bench.rerank` share: a deployment of one kind of pipeline twice,
`batched` (`max_batch` 32, `max_wait_ms` 5) and `alone` (`max_batch` 1), closed-loop levels
of requests against its route taking turns between the two, and the table of the rows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms
from tuning.deployment import private_deployment

console = Console(width=140)
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1", "MMQ_LOG_LEVEL": "WARNING"}
"""No keys; WARNING, not the harness's INFO: no log line per task on the measured path
(readiness is `/readyz`, not the workers' logs)."""
WORDS = "the quick brown fox jumps over a lazy dog near the river bank at dawn".split()  # noqa: SIM905
TARGETS = ("batched", "alone")
WARM_UP_CONCURRENCY = 4
WARM_UP_REQUESTS = 8


@dataclass
class Level:
    target: str
    concurrency: int
    requests: int
    failures: int
    texts_per_s: float
    """Items (texts, documents) per second: the JSON's name for both benches."""
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class Route:
    """Where a level's requests go and what each of them is."""

    url: str
    path: str
    body: Callable[[str, int], dict[str, Any]]
    """The JSON of request `i` to the pipeline `target`: `body(target, i)`."""
    items: int
    """What a request counts for in the items per second (its texts, its documents)."""


def arguments(
    prog: str,
    doc: str | None,
    *,
    model_help: str,
    items: str,
    concurrency: list[int],
    requests: int,
    out: Path,
) -> argparse.ArgumentParser:
    """The command line of a bench of batched against alone: `--{items}` a request (8),
    `--concurrency` (comma-separated), `--requests` a level, `--rounds` (2) and `--out`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--model", default="", help=model_help)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(f"--{items}", type=int, default=8)
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=concurrency
    )
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=out)
    return parser


def sentences(count: int, start: int) -> list[str]:
    return [" ".join(WORDS[(start + i + j) % len(WORDS)] for j in range(12)) for i in range(count)]


def pipeline_toml(
    name: str, kind: str, impl: str, model: str, device: str, max_batch: int, wait_ms: int
) -> str:
    return (
        f'[pipelines.{name}]\nkind = "{kind}"\nimpl = "{impl}"\n'
        f'model = {json.dumps(model)}\ndevice = "{device}"\nmax_batch = {max_batch}\n'
        f"max_wait_ms = {wait_ms}\nconcurrency = 64\n"
    )


def deploy(stack: ExitStack, kind: str, impl: str, model: str, device: str) -> str:
    """Redis, the API and a `batched` and an `alone` worker of `kind`, ready; the API's URL.
    They stop when `stack` closes."""
    config = pipeline_toml("batched", kind, impl, model, device, 32, 5) + pipeline_toml(
        "alone", kind, impl, model, device, 1, 0
    )
    dep = stack.enter_context(
        private_deployment(
            config, ENV, [], f"mmq-bench-{kind}-", test_pipelines=False, reaper=False
        )
    )
    for name in TARGETS:
        dep.start_worker(name, wait=False)
    dep.wait_ready(timeout_s=300)
    return dep.base_url


def summary(
    target: str, concurrency: int, requests: int, items: float, wall: float, latencies: list[float]
) -> Level:
    """A level of `requests` of which `latencies` succeeded, `items` in all, in `wall` seconds."""
    return Level(
        target, concurrency, requests, requests - len(latencies), round(items / wall, 1),
        round(percentile_ms(latencies, 50), 1), round(percentile_ms(latencies, 99), 1),
    )  # fmt: skip


async def level(route: Route, target: str, concurrency: int, requests: int) -> Level:
    """`requests` to `target` over `concurrency` closed loops; a non-200 answer is a failure."""
    todo = iter(range(requests))
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=route.url, timeout=120) as http:

        async def lane() -> None:
            for i in todo:
                body = route.body(target, i)
                start = time.perf_counter()
                r = await http.post(route.path, json=body)
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return summary(target, concurrency, requests, len(latencies) * route.items, wall, latencies)


async def measure(
    route: Route, concurrencies: Sequence[int], requests: int, rounds: int
) -> list[Level]:
    """A warm-up of each target, then at each concurrency `rounds` of `requests` to each,
    the order swapped every round; each level is printed as it ends."""
    for target in TARGETS:
        await level(route, target, WARM_UP_CONCURRENCY, WARM_UP_REQUESTS)
    levels = []
    for concurrency in concurrencies:
        for round_no in range(rounds):
            order = TARGETS if round_no % 2 == 0 else TARGETS[::-1]
            for target in order:
                levels.append(await level(route, target, concurrency, requests))
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


def report(
    title: str, unit: str, rows: list[Level], extra: Sequence[Level] = (), note: str = ""
) -> dict[str, float]:
    """The table of `rows` and then `extra` (`unit`/s, p50, p99, failures), and batched /
    alone in `unit`/s at each concurrency of `rows`, printed with `note` after it."""
    table = Table(title=title)
    for col in ("target", "concurrency", f"{unit}/s", "p50 ms", "p99 ms", "failures"):
        table.add_column(col, justify="right")
    for lv in [*rows, *extra]:
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
    console.print(f"batched / alone ({unit}/s): {ratios}{note}")
    return ratios


def write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out}")
