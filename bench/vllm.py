"""mmq in front of the real vLLM, against the same vLLM called directly; one run.

    python -m bench.vllm [--model tiny|DIR] [--concurrency 1,16,64] [--requests 128]
                         [--max-tokens 64] [--eager] [--stream-interval N]
                         [--out bench/results/vllm.json]

Starts Redis, the API and one LLM worker whose engine is vLLM (on a CPU its CPU build, from
the environment `make install` builds; on a GPU the `vllm` the worker finds), on the tests'
tiny random Llama unless `--model` names one. At each concurrency (closed loop, streamed
chats over SSE like a client, temperature 0) the same prompts go through mmq's
`/v1/chat/completions` and straight to the engine's port, taking turns in two blocks each
so that a slow spell falls on both: TTFT p50/p99, TPOT p50, end to end p50 and output
tokens/s of each, and each as mmq / direct. `--stream-interval N` starts vLLM with
`options.stream_interval` N (its `--stream-interval`: N tokens per streamed chunk), so both
paths read the same chunks; run it at 1 and 4 to see what gathering costs in TTFT and
inter-token latency and what it saves mmq.

On a CPU, vLLM, mmq and the client share the same cores: every cycle mmq spends is one
the engine does not get, so the ratios there are mmq's cost on a machine without a spare
core, not what a GPU host (where the engine's work is on the GPU) would see.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import run_meta
from bench.llm_stream import Slo, Target, compare, stream_chat
from common.procs import free_port
from harness.kinds import llm_toml
from tuning.deployment import private_deployment

console = Console()
DEFAULT_OUT = Path("bench/results/vllm.json")
BLOCKS = 2
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1", "MMQ_LOG_LEVEL": "WARNING"}
COLUMNS = (
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p99_ms", "TTFT p99"),
    ("tpot_p50_ms", "TPOT p50"),
    ("e2e_p50_ms", "E2E p50"),
    ("output_tokens_per_s", "tok/s"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.vllm", description=__doc__)
    parser.add_argument("--model", default="tiny", help="tiny, or a model directory")
    parser.add_argument(
        "--concurrency", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16, 64]
    )
    parser.add_argument("--requests", type=int, default=128, help="per level (>= 2x lanes)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--eager", action="store_true", help="vLLM's --enforce-eager")
    parser.add_argument("--stream-interval", type=int, default=1, help="tokens per chunk")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def deploy(args: argparse.Namespace, stack: ExitStack) -> tuple[str, str]:
    """Start everything; returns the API's URL and the engine's."""
    model = args.model
    if model == "tiny":
        from harness.models.llm import build_llm

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-bench-vllm-")))
        model = str(build_llm(tmp / "tiny-llm", "tiny"))
    args.model_path = model
    port = free_port()
    options: dict[str, Any] = {
        "engine": "vllm", "port": port, "max_inflight": max(args.concurrency),
        "startup_timeout_s": 900,
    }  # fmt: skip
    if args.eager:
        options["extra_args"] = ["--enforce-eager"]
    if args.stream_interval != 1:
        options["stream_interval"] = args.stream_interval
    dep = stack.enter_context(
        private_deployment(
            llm_toml("vllm", model, options), ENV | {"HF_HUB_OFFLINE": "1"}, [],
            "mmq-bench-vllm-", test_pipelines=False, reaper=False,
        )
    )  # fmt: skip
    dep.start_worker("vllm", wait=False)
    dep.wait_ready(timeout_s=900)
    return dep.base_url, f"http://127.0.0.1:{port}"


async def measure(api: str, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    targets = [
        Target("direct", engine, args.model_path),
        Target("mmq", api, "vllm", {"cache": False}),
    ]
    async with httpx.AsyncClient(timeout=900, limits=httpx.Limits(max_connections=512)) as http:
        for target in targets:  # both paths warm
            await stream_chat(http, target.base, target.model, "warm", 4, **target.extra)
        return await compare(
            http, targets, args.concurrency, args.requests, args.max_tokens,
            Slo(10_000, 1_000), BLOCKS,
        )  # fmt: skip


def ratios(results: dict[str, Any], levels: list[int]) -> dict[str, float]:
    """mmq / direct of each measure at each level."""
    out: dict[str, float] = {}
    for c in levels:
        mmq, direct = results[f"mmq c={c}"], results[f"direct c={c}"]
        for key, label in COLUMNS:
            if direct[key]:
                out[f"c={c} {label} mmq/direct"] = mmq[key] / direct[key]
    return out


def report(results: dict[str, Any], levels: list[int]) -> dict[str, float]:
    table = Table(title="vLLM: through mmq and straight to the engine (ms unless named)")
    table.add_column("target", no_wrap=True)
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    for name, row in results.items():
        table.add_row(name, *(f"{row[key]:.1f}" for key, _ in COLUMNS))
    console.print(table)
    found = ratios(results, levels)
    ratio_table = Table(
        title=f"mmq / direct (vLLM, mmq and the client share {os.cpu_count()} cores)"
    )
    ratio_table.add_column("streams", justify="right")
    for _, label in COLUMNS:
        ratio_table.add_column(label, justify="right")
    for c in levels:
        cells = [found.get(f"c={c} {label} mmq/direct") for _, label in COLUMNS]
        ratio_table.add_row(str(c), *("-" if v is None else f"{v:.2f}x" for v in cells))
    console.print(ratio_table)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with ExitStack() as stack:
        api, engine = deploy(args, stack)
        results = asyncio.run(measure(api, engine, args))
    found = report(results, args.concurrency)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": run_meta(), "args": {k: str(v) for k, v in vars(args).items()},
               "results": results, "ratios": found}  # fmt: skip
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
