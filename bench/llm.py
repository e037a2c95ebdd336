"""LLM: the service beside a direct engine call, short prompts beside long ones with and
without long/short routing, and the response cache; one run.

    python -m bench.llm [--model tiny|DIR] [--requests 16] [--max-tokens 32]
                        [--long-tokens 200] [--out bench/results/llm.json]

Starts Redis, the API and three LLM workers, each running its own `transformers serve`
engine on the same model (default: the tests' tiny random Llama, built here):

- `mixed`: one engine for every prompt (no routing), max_inflight 2;
- `routed` + `routed-long`: prompts over the threshold go to their own engine.

Measures, all streamed over SSE like a client:

1. overhead: `--requests` chat requests one at a time and 8 at once, through
   `POST /v1/chat/completions` (stream) and straight to the `mixed` engine's port; TTFT
   and end-to-end p50, and their ratio service / direct;
2. routing: 4 long prompts (`--long-tokens` each) submitted, then 6 short ones, one
   after another, while they run, to `mixed` and then to `routed`; short-prompt p50/p95
   end-to-end, and the ratio mixed / routed. On a CPU the engines share the cores, so
   routing removes the wait for a slot but not the competition for compute; on GPUs
   each engine has its own device;
3. cache: a temperature-0 request, then the same again; latency of the hit / the miss.

Goals: service TTFT within 1.5x of direct at one request (the tiny model makes the
engine's own time small, so this is a harsh test of the service's share); routing
brings short-prompt p95 down by 2x or more; a cache hit under 20 % of a miss.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms
from common.procs import free_port
from common.sse import aparse_lines
from host.launcher import ProcSpec, Supervisor, mmq_command
from host.redis_server import RedisServer

console = Console()
DEFAULT_OUT = Path("bench/results/llm.json")
THRESHOLD = 100
GOALS = {"overhead_ttft_max": 1.5, "routing_p95_min": 2.0, "cache_hit_max": 0.2}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.llm", description=__doc__)
    parser.add_argument("--model", default="tiny", help="tiny, or a model directory")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
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


def deploy(args: argparse.Namespace, stack: ExitStack) -> tuple[str, str, Supervisor]:
    """Start everything; returns the API's URL, the `mixed` engine's URL, the supervisor.
    Sets `args.model_path` (what the engine itself answers to)."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-bench-llm-")))
    model = args.model
    if model == "tiny":
        from tests.support.models.llm import build_llm

        model = str(build_llm(tmp / "tiny-llm", "tiny"))
    args.model_path = model
    ports = {name: free_port() for name in ("mixed", "routed", "routed-long")}
    config = tmp / "mmq.toml"
    config.write_text(
        pipeline_toml("mixed", model, ports["mixed"], {})
        + pipeline_toml("routed", model, ports["routed"], {"long_pipeline": "routed-long"})
        + pipeline_toml("routed-long", model, ports["routed-long"], {})
    )
    redis = RedisServer(tmp / "redis", port=free_port(), persist=False)
    redis.start()
    stack.callback(redis.stop)
    api_port = free_port()
    env = {
        **os.environ,
        "MMQ_REDIS_URL": redis.url,
        "MMQ_CONFIG_FILE": str(config),
        "MMQ_DATA_DIR": str(tmp / "data"),
        "MMQ_API__PORT": str(api_port),
        "MMQ_LOG_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
    }
    specs = [ProcSpec("api", mmq_command("api"))] + [
        ProcSpec(name, mmq_command("worker", "--pipeline", name)) for name in ports
    ]
    supervisor = Supervisor(specs, base_env=env)
    stack.callback(supervisor.terminate)
    supervisor.start()
    return f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ports['mixed']}", supervisor


async def wait_ready(api: str) -> None:
    deadline = time.monotonic() + 600
    async with httpx.AsyncClient(timeout=10) as http:
        while time.monotonic() < deadline:
            try:
                if (await http.get(f"{api}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1)
    raise RuntimeError("the deployment did not get ready in 600 s")


async def stream_chat(
    http: httpx.AsyncClient, base: str, model: str, text: str, max_tokens: int, **extra: Any
) -> tuple[float, float]:
    """(TTFT, end-to-end) seconds of one streamed chat completion."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    start = time.perf_counter()
    first: float | None = None
    async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for message in aparse_lines(response.aiter_lines()):
            if first is None and _has_text(message.data):
                first = time.perf_counter()
    end = time.perf_counter()
    return (first or end) - start, end - start


def _has_text(data: str) -> bool:
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def overhead(api: str, engine: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=300) as http:
        for concurrency in (1, 8):
            for target, base, model, extra in (
                ("direct", engine, args.model_path, {}),
                ("service", api, "mixed", {"cache": False}),
            ):
                shots: list[tuple[float, float]] = []
                for start in range(0, args.requests, concurrency):
                    batch = range(start, min(start + concurrency, args.requests))
                    shots += await asyncio.gather(
                        *(
                            stream_chat(http, base, model, f"Req {i}", args.max_tokens, **extra)
                            for i in batch
                        )
                    )
                out[f"{target} c={concurrency}"] = {
                    "ttft_p50_ms": percentile_ms([s[0] for s in shots], 50),
                    "e2e_p50_ms": percentile_ms([s[1] for s in shots], 50),
                }
    return out


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
                "short_e2e_p50_ms": percentile_ms([s[1] for s in shorts], 50),
                "short_e2e_p95_ms": percentile_ms([s[1] for s in shorts], 95),
            }
    return out


async def cache(api: str, args: argparse.Namespace) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=300) as http:
        stamp = time.time_ns()
        _, miss = await stream_chat(http, api, "mixed", f"Cache {stamp}", args.max_tokens)
        _, hit = await stream_chat(http, api, "mixed", f"Cache {stamp}", args.max_tokens)
    return {"miss_ms": miss * 1000, "hit_ms": hit * 1000}


def report(results: dict[str, Any]) -> dict[str, float]:
    o, r, c = results["overhead"], results["routing"], results["cache"]
    ratios = {
        "service/direct TTFT c=1": o["service c=1"]["ttft_p50_ms"] / o["direct c=1"]["ttft_p50_ms"],
        "service/direct E2E c=1": o["service c=1"]["e2e_p50_ms"] / o["direct c=1"]["e2e_p50_ms"],
        "service/direct E2E c=8": o["service c=8"]["e2e_p50_ms"] / o["direct c=8"]["e2e_p50_ms"],
        "short p95 mixed/routed": r["mixed"]["short_e2e_p95_ms"] / r["routed"]["short_e2e_p95_ms"],
        "cache hit/miss": c["hit_ms"] / c["miss_ms"],
    }
    table = Table(title="LLM through mmq (p50 unless named)")
    table.add_column("measure")
    table.add_column("ms", justify="right")
    for name, row in o.items():
        table.add_row(f"{name} TTFT", f"{row['ttft_p50_ms']:.1f}")
        table.add_row(f"{name} E2E", f"{row['e2e_p50_ms']:.1f}")
    for model, row in r.items():
        table.add_row(
            f"short prompts, longs in flight, {model}: p50", f"{row['short_e2e_p50_ms']:.0f}"
        )
        table.add_row(
            f"short prompts, longs in flight, {model}: p95", f"{row['short_e2e_p95_ms']:.0f}"
        )
    table.add_row("cache miss", f"{c['miss_ms']:.1f}")
    table.add_row("cache hit", f"{c['hit_ms']:.1f}")
    console.print(table)
    for name, value in ratios.items():
        console.print(f"{name}: {value:.2f}")
    return ratios


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with ExitStack() as stack:
        api, engine, supervisor = deploy(args, stack)

        async def run() -> dict[str, Any]:
            await wait_ready(api)
            async with httpx.AsyncClient(timeout=600) as http:  # every engine up and warm
                for model in ("mixed", "routed", "routed-long"):
                    await stream_chat(http, api, model, "warm", 4, cache=False)
            return {
                "overhead": await overhead(api, engine, args),
                "routing": await routing(api, args),
                "cache": await cache(api, args),
            }

        results = asyncio.run(run())
        supervisor.terminate()
    ratios = report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": {
            "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "cpu_count": os.cpu_count(),
            "load_avg": os.getloadavg(),
        },
        "goals": GOALS,
        "results": results,
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
