"""LLM: the service beside a direct engine call on the token path, short prompts beside
long ones with and without long/short routing, and the response cache; one run.

    python -m bench.llm [--model tiny|DIR] [--concurrency 1,8,32] [--requests 32]
                        [--max-tokens 32] [--slo-ttft-ms 500] [--slo-tpot-ms 100]
                        [--long-tokens 200] [--out bench/results/llm.json]

Starts Redis, the API and four LLM workers, each running its own `transformers serve`
engine on the same model (default: the tests' tiny random Llama, built here):

- `path`: max_inflight = the highest concurrency, so the overhead section measures the
  token path, not admission;
- `mixed`: one engine for every prompt (no routing), max_inflight 2;
- `routed` + `routed-long`: prompts over the threshold go to their own engine.

Measures, all streamed over SSE like a client:

1. overhead: at each concurrency (closed loop), `POST /v1/chat/completions` (stream)
   through mmq and straight to the `path` engine's port, taking turns in two blocks
   each: TTFT p50/p99, TPOT p50, ITL p50, end to end p50, output tokens/s, and goodput
   (requests/s within the SLO), each as service / direct;
2. routing: 4 long prompts (`--long-tokens` each) submitted, then 6 short ones, one
   after another, while they run, to `mixed` and then to `routed`; short-prompt p50/p95
   end-to-end, and the ratio mixed / routed. On a CPU the engines share the cores, so
   routing removes the wait for a slot but not the competition for compute; on GPUs
   each engine has its own device;
3. cache: a temperature-0 request, then the same again; latency of the hit / the miss.

Goals: service TTFT p50 within 3 ms or 10 % of direct (whichever is larger), end to end
within 10 %, output tokens/s at least 0.95x direct at the highest concurrency; routing
brings short-prompt p95 down by 2x or more; a cache hit under 20 % of a miss. On a CPU
the engine, the service and the client share the cores: every CPU cycle the service
spends is one the engine does not get.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from bench.llm_stream import Slo, Target, compare, stream_chat
from common.procs import free_port
from tuning.deployment import private_deployment

console = Console()
DEFAULT_OUT = Path("bench/results/llm.json")
THRESHOLD = 100
GOALS = {
    "ttft_p50_extra_max_ms": 3.0,
    "ttft_p50_ratio_max": 1.1,
    "e2e_p50_ratio_max": 1.1,
    "tokens_per_s_ratio_min": 0.95,
    "routing_p95_min": 2.0,
    "cache_hit_max": 0.2,
}
BLOCKS = 2
"""Turns each target takes per concurrency level (a slow spell falls on both)."""
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1", "MMQ_LOG_LEVEL": "WARNING"}
"""No keys; WARNING, not the harness's INFO: no log line per request on the measured path
(readiness is `/readyz`, not the workers' logs)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.llm", description=__doc__)
    parser.add_argument("--model", default="tiny", help="tiny, or a model directory")
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--requests", type=int, default=32, help="per level (>= 2x lanes)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slo-ttft-ms", type=float, default=500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)
    parser.add_argument("--long-tokens", type=int, default=200)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def pipeline_toml(name: str, model: str, port: int, extra: dict[str, Any]) -> str:
    options = {
        "engine": "transformers",
        "max_inflight": 2,
        "port": port,
        "long_prompt_threshold": THRESHOLD,
        "startup_timeout_s": 600,
        **extra,
    }
    lines = [
        f"[pipelines.{name}]",
        'kind = "llm"',
        'impl = "pipelines.llm:LlmPipeline"',
        f"model = {json.dumps(model)}",
        f"[pipelines.{name}.options]",
        *(f"{k} = {json.dumps(v)}" for k, v in options.items()),
    ]
    return "\n".join(lines) + "\n"


def deploy(args: argparse.Namespace, stack: ExitStack) -> tuple[str, str]:
    """Start everything; returns the API's URL and the `path` engine's URL. Sets
    `args.model_path` (what the engine itself answers to)."""
    model = args.model
    if model == "tiny":
        from harness.models.llm import build_llm

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-bench-llm-")))
        model = str(build_llm(tmp / "tiny-llm", "tiny"))
    args.model_path = model
    ports = {name: free_port() for name in ("path", "mixed", "routed", "routed-long")}
    config = (
        pipeline_toml("path", model, ports["path"], {"max_inflight": max(args.concurrency)})
        + pipeline_toml("mixed", model, ports["mixed"], {})
        + pipeline_toml("routed", model, ports["routed"], {"long_pipeline": "routed-long"})
        + pipeline_toml("routed-long", model, ports["routed-long"], {})
    )
    dep = stack.enter_context(
        private_deployment(config, ENV, [], "mmq-bench-llm-", test_pipelines=False, reaper=False)
    )
    for name in ports:  # the engines start side by side
        dep.start_worker(name, wait=False)
    dep.wait_ready(timeout_s=600)
    return dep.base_url, f"http://127.0.0.1:{ports['path']}"


async def overhead(api: str, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """service and direct at each concurrency, in alternating blocks."""
    targets = [
        Target("direct", engine, args.model_path),
        Target("service", api, "path", {"cache": False}),
    ]
    limits = httpx.Limits(max_connections=256)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        return await compare(
            http,
            targets,
            args.concurrency,
            args.requests,
            args.max_tokens,
            Slo(args.slo_ttft_ms, args.slo_tpot_ms),
            BLOCKS,
        )


async def routing(api: str, args: argparse.Namespace) -> dict[str, Any]:
    long_text = "The quick brown fox jumps over the lazy dog. " * 40
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=600) as http:
        for model in ("mixed", "routed"):
            longs = [
                asyncio.create_task(
                    stream_chat(http, api, model, f"{long_text}{i}", args.long_tokens, cache=False)
                )
                for i in range(4)
            ]
            await asyncio.sleep(0.5)
            shorts = []  # one after another, while the long ones run
            for i in range(6):
                shorts.append(
                    await stream_chat(http, api, model, f"Short {i}", args.max_tokens, cache=False)
                )
            await asyncio.gather(*longs)
            out[model] = {
                "short_e2e_p50_ms": percentile_ms([s.e2e_s for s in shorts], 50),
                "short_e2e_p95_ms": percentile_ms([s.e2e_s for s in shorts], 95),
            }
    return out


async def cache(api: str, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=300) as http:
        stamp = time.time_ns()
        miss = await stream_chat(http, api, "mixed", f"Cache {stamp}", args.max_tokens)
        hit = await stream_chat(http, api, "mixed", f"Cache {stamp}", args.max_tokens)
    return {"miss_ms": miss.e2e_s * 1000, "hit_ms": hit.e2e_s * 1000}


OVERHEAD_COLUMNS = (
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p99_ms", "TTFT p99"),
    ("tpot_p50_ms", "TPOT p50"),
    ("itl_p50_ms", "ITL p50"),
    ("e2e_p50_ms", "E2E p50"),
    ("output_tokens_per_s", "tok/s"),
    ("goodput_rps", "goodput/s"),
    ("tokens_per_chunk", "tok/chunk"),
)


def overhead_ratios(o: dict[str, Any], levels: list[int]) -> dict[str, float]:
    """service / direct of each measure at each level, and the TTFT difference."""
    ratios: dict[str, float] = {}
    for c in levels:
        service, direct = o[f"service c={c}"], o[f"direct c={c}"]
        for key, label in OVERHEAD_COLUMNS[:-1]:
            if direct[key]:
                ratios[f"c={c} {label} service/direct"] = service[key] / direct[key]
        ratios[f"c={c} TTFT p50 service-direct ms"] = service["ttft_p50_ms"] - direct["ttft_p50_ms"]
    return ratios


def report(results: dict[str, Any], levels: list[int]) -> dict[str, float]:
    o, r, c = results["overhead"], results["routing"], results["cache"]
    ratios = {
        **overhead_ratios(o, levels),
        "short p95 mixed/routed": r["mixed"]["short_e2e_p95_ms"] / r["routed"]["short_e2e_p95_ms"],
        "cache hit/miss": c["hit_ms"] / c["miss_ms"],
    }
    table = Table(title="LLM token path: through mmq and straight to the engine (ms unless named)")
    table.add_column("target", no_wrap=True)
    for _, label in OVERHEAD_COLUMNS:
        table.add_column(label, justify="right")
    for name, row in o.items():
        table.add_row(name, *(f"{row[key]:.1f}" for key, _ in OVERHEAD_COLUMNS))
    console.print(table)
    other = Table(title="Routing and cache (ms)")
    other.add_column("measure")
    other.add_column("ms", justify="right")
    for model, row in r.items():
        other.add_row(f"short, longs in flight, {model}: p50", f"{row['short_e2e_p50_ms']:.0f}")
        other.add_row(f"short, longs in flight, {model}: p95", f"{row['short_e2e_p95_ms']:.0f}")
    other.add_row("cache miss", f"{c['miss_ms']:.1f}")
    other.add_row("cache hit", f"{c['hit_ms']:.1f}")
    console.print(other)
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with ExitStack() as stack:
        api, engine = deploy(args, stack)

        async def run() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=600) as http:  # every engine up and warm
                for model in ("path", "mixed", "routed", "routed-long"):
                    await stream_chat(http, api, model, "warm", 4, cache=False)
            return {
                "overhead": await overhead(api, engine, args),
                "routing": await routing(api, args),
                "cache": await cache(api, args),
            }

        results = asyncio.run(run())
    ratios = report(results, args.concurrency)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": run_meta(),
        "goals": GOALS,
        "results": results,
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
