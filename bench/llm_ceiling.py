"""The LLM token path's ceiling: mmq in front of a near-free synthetic engine, beside the
same engine called directly and behind vllm-router (a Rust router), in one run; and the CPU
mmq and the router spend per token and per request.

    python -m bench.llm_ceiling [--loads 16x128@20,64x128@20,256x128@20,100x384@14,64x8@20]
                                [--rounds 2] [--api-workers 1] [--worker-instances 1]
                                [--no-router] [--stream-interval N] [--out FILE.json]

A load `SxT@M` is S streams in a closed loop (each sends its next request as soon as its
last one ended), T output tokens each, an engine step of M ms (`bench.synthetic_engine`:
one token per running sequence per step, about 10 µs of CPU per token). Each stream sends
`--rounds` requests. Per load, in this order and each after a short warm-up of its own:
direct (`POST /v1/chat/completions`, `stream: true`, to the engine); through vllm-router
(PyPI's `vllm-router`, `python -m vllm_router.launch_router --worker-urls ENGINE --policy
round_robin`, one router per engine step; skipped with `--no-router`, and said, where the
package is not installed); and through mmq (the same request to mmq's API, whose LLM
pipeline has `engine = "url"` on that engine and `max_inflight = 512`). `--api-workers`
runs the API as that many processes (`api.workers`), and `--worker-instances` feeds each
engine from that many relay workers (`instances`), to see what a second core gives.

Reported per load and target: output tokens/s (and its ratio to direct), TTFT p50/p99,
TPOT p50, requests/s; for mmq the CPU time of each of its processes (API, LLM worker,
Redis, reaper, scheduler) over the level, and for the router its process's, per token.
Across the loads, mmq's CPU = a x tokens + b x requests is fitted by least squares over
mmq's levels only: `a` is the CPU per streamed token and `b` per request, summed over
every mmq process (and per process: Redis's own column). Goals (issue 64), printed met or
missed at the end: a <= 50 µs, Redis's a <= 5 µs and b <= 2.5 ms; at 64x8@20
(request-bound) tokens/s >= 0.85x direct; at 16 streams TTFT p50 <= direct + 8 ms; at
256x128@20 tokens/s >= 0.95x direct, and TTFT p50 over direct there
against the burst's CPU bound, b x streams / cores (`os.cpu_count()`): the CPU that
starting the whole burst takes, spread over every core.

The client is lean (aiohttp, lines not parsed as JSON except the usage chunk) and runs on
the same cores: its CPU is not counted, but it competes, as the engine does.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import httpx
import psutil
import redis

from bench.common import percentile_ms, run_meta
from bench.llm_ceiling_report import Level, by_role, console, report
from common.procs import free_port
from tuning.deployment import private_deployment, wait_until

DEFAULT_OUT = Path("bench/results/llm_ceiling.json")
DEFAULT_LOADS = "16x128@20,64x128@20,256x128@20,100x384@14,64x8@20"
MAX_INFLIGHT = 512
ENV = {
    "MMQ_AUTH__REQUIRED": "false",
    "MMQ_API__HOST": "127.0.0.1",
    # What is measured is mmq's CPU: no log line per request (WARNING, not the harness's
    # INFO; readiness is `/readyz`), and the scheduler at its default step.
    "MMQ_LOG_LEVEL": "WARNING",
    "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.2",
}
GOALS = {
    # Issue 64, mmq's: fitted over the loads, all of mmq's processes, and Redis's own.
    "cpu_per_request_ms_max": 2.5,
    "cpu_per_token_us_max": 50.0,
    "redis_cpu_per_token_us_max": 5.0,
    # Tokens/s through mmq over direct's: at 64x8@20 (request-bound) and at 256x128@20.
    "tokens_ratio_min_64x8": 0.85,
    "tokens_ratio_min_256x128": 0.95,
    # TTFT p50 through mmq over direct's at 16 streams, in ms.
    "ttft_p50_extra_ms_max_16": 8.0,
    # At 256x128@20, TTFT p50 over direct's as a share of the burst's CPU bound: the fitted
    # CPU per request x 256 streams / os.cpu_count().
    "ttft_p50_extra_vs_burst_bound_max": 1.0,
}
ROUTER = [sys.executable, "-m", "vllm_router.launch_router", "--host", "127.0.0.1"]
"""vllm-router's own launcher (its `vllm-router` console script), one engine behind it."""


@dataclass(frozen=True)
class Load:
    streams: int
    tokens: int
    step_ms: int

    @property
    def name(self) -> str:
        return f"{self.streams}x{self.tokens}@{self.step_ms}"

    @classmethod
    def parse(cls, text: str) -> Load:
        shape, _, step = text.partition("@")
        streams, _, tokens = shape.partition("x")
        return cls(int(streams), int(tokens), int(step or 20))


@dataclass
class Shot:
    ok: bool = False
    error: str = ""
    start: float = 0.0
    first: float = 0.0
    end: float = 0.0
    tokens: int = 0


async def one_stream(http: aiohttp.ClientSession, url: str, model: str, tokens: int) -> Shot:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Count."}],
        "max_tokens": tokens,
        "temperature": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    shot = Shot(start=time.perf_counter())
    try:
        async with http.post(f"{url}/v1/chat/completions", json=body) as response:
            if response.status != 200:
                shot.error = f"{response.status}: {(await response.text())[:200]}"
                return shot
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                if not shot.first and b'"content"' in line and _has_text(line):
                    shot.first = time.perf_counter()
                elif b'"usage"' in line:
                    usage = json.loads(line[6:]).get("usage") or {}
                    shot.tokens = int(usage.get("completion_tokens") or 0)
                elif line.startswith(b"data: [DONE]"):
                    shot.ok = shot.tokens > 0 and shot.first > 0
                    if not shot.ok:
                        shot.error = "no usage or no content before [DONE]"
    except (aiohttp.ClientError, TimeoutError) as exc:
        shot.error = f"{type(exc).__name__}: {exc}"[:200]
    shot.end = time.perf_counter()
    return shot


def _has_text(line: bytes) -> bool:
    """Whether an SSE chunk carries text (parsed only until a stream's first one)."""
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def closed_loop(url: str, model: str, load: Load, rounds: int) -> tuple[list[Shot], float]:
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def lane() -> list[Shot]:
            return [await one_stream(http, url, model, load.tokens) for _ in range(rounds)]

        start = time.perf_counter()
        lanes = await asyncio.gather(*(lane() for _ in range(load.streams)))
        return [s for shots in lanes for s in shots], time.perf_counter() - start


def summarize(load: Load, target: str, shots: list[Shot], wall_s: float) -> Level:
    good = [s for s in shots if s.ok]
    tokens = sum(s.tokens for s in good)
    ttfts = [s.first - s.start for s in good]
    tpots = [(s.end - s.first) / (s.tokens - 1) for s in good if s.tokens > 1]
    return Level(
        load=load.name,
        target=target,
        requests=len(shots),
        failures=len(shots) - len(good),
        wall_s=round(wall_s, 3),
        tokens_per_s=round(tokens / wall_s, 1),
        requests_per_s=round(len(good) / wall_s, 2),
        ttft_p50_ms=round(percentile_ms(ttfts, 50), 2),
        ttft_p99_ms=round(percentile_ms(ttfts, 99), 2),
        tpot_p50_ms=round(percentile_ms(tpots, 50), 3),
        tokens=tokens,
        errors=sorted({s.error for s in shots if s.error})[:5],
    )


class CpuMeter:
    """CPU seconds (user + system) of each named process and its children."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}

    def read(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            total = 0.0
            for p in [proc, *proc.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    continue
            out[name] = total
        return out


def pipeline_toml(step_ms: int, engine_url: str) -> str:
    name = f"llm{step_ms}"
    return (
        f'[pipelines.{name}]\nkind = "llm"\nimpl = "pipelines.llm:LlmPipeline"\n'
        f'model = "synthetic"\n[pipelines.{name}.options]\nengine = "url"\n'
        f'engine_url = "{engine_url}"\nmax_inflight = {MAX_INFLIGHT}\n'
    )


@dataclass
class Targets:
    api: str
    engines: dict[int, str]
    """Each engine step's synthetic engine."""
    meter: CpuMeter
    """mmq's processes: API, reaper, scheduler, the relay workers of each step, Redis."""
    routers: dict[int, str] = field(default_factory=dict)
    """Each engine step's vllm-router, in front of that step's engine (none: no router)."""
    router_meter: CpuMeter | None = None
    """The routers' processes, apart from mmq's."""


def deploy(
    loads: list[Load],
    api_workers: int,
    worker_instances: int,
    router: bool,
    stack: ExitStack,
    stream_interval: int = 1,
) -> Targets:
    """The synthetic engines, mmq in front of them (`worker_instances` relay workers per
    step) and, with `router`, a vllm-router in front of each."""
    ports = {step: free_port() for step in sorted({load.step_ms for load in loads})}
    engines = {step: f"http://127.0.0.1:{port}" for step, port in ports.items()}
    config = "".join(pipeline_toml(step, url) for step, url in engines.items())
    env = ENV | ({"MMQ_API__WORKERS": str(api_workers)} if api_workers > 1 else {})
    dep = stack.enter_context(
        private_deployment(config, env, [], "mmq-bench-ceiling-", test_pipelines=False)
    )
    engine = [sys.executable, "-m", "bench.synthetic_engine"]
    engine += ["--stream-interval", str(stream_interval)]
    for step, port in ports.items():
        proc = dep.launch(f"engine{step}", [*engine, "--port", str(port), "--step-ms", str(step)])
        wait_until(lambda url=engines[step]: answers(f"{url}/health"), proc, timeout_s=120)
    routers, router_pids = {}, {}
    for step, url in engines.items() if router else ():
        port = free_port()
        proc = dep.launch(
            f"router{step}",
            [*ROUTER, "--port", str(port), "--worker-urls", url, "--policy", "round_robin",
             "--prometheus-port", str(free_port()), "--log-level", "warning"],
        )  # fmt: skip
        routers[step] = f"http://127.0.0.1:{port}"
        wait_until(lambda r=routers[step]: answers(f"{r}/health"), proc, timeout_s=120)
        router_pids[f"router{step}"] = proc.process.pid
    workers = {
        f"worker{step}" + (f"-{i}" if i else ""): dep.start_worker(f"llm{step}", i, wait=False)
        for step in ports
        for i in range(worker_instances)
    }
    dep.wait_ready(timeout_s=120)
    redis_pid = int(redis.Redis.from_url(dep.redis_url).info("server")["process_id"])
    pids = {"api": dep.pids("api")[0], "reaper": dep.pids("reaper")[0]}
    pids["scheduler"] = dep.pids("scheduler")[0]
    pids |= {name: w.process.pid for name, w in workers.items()} | {"redis": redis_pid}
    meter = CpuMeter(pids)
    return Targets(
        dep.base_url, engines, meter, routers, CpuMeter(router_pids) if routers else None
    )


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


async def run(args: argparse.Namespace, targets: Targets, loads: list[Load]) -> list[Level]:
    """Per load: direct, the router (where there is one) and mmq, each after its warm-up."""
    levels = []
    for load in loads:
        step = load.step_ms
        runs: list[tuple[str, str, str, CpuMeter | None]] = [
            ("direct", targets.engines[step], "synthetic", None)
        ]
        if step in targets.routers:
            runs.append(("router", targets.routers[step], "synthetic", targets.router_meter))
        runs.append(("mmq", targets.api, f"llm{step}", targets.meter))
        for target, url, model, meter in runs:
            await closed_loop(url, model, Load(min(load.streams, 16), 4, step), 1)
            before: dict[str, float] = meter.read() if meter else {}
            shots, wall = await closed_loop(url, model, load, args.rounds)
            after: dict[str, float] = meter.read() if meter else {}
            level = summarize(load, target, shots, wall)
            level.cpu_s = {name: round(after[name] - before[name], 4) for name in after}
            levels.append(level)
            progress(level)
    return levels


def progress(level: Level) -> None:
    cpu = f", {level.target} CPU {sum(level.cpu_s.values()):.2f} s" if level.cpu_s else ""
    console.print(
        f"{level.load} {level.target}: {level.tokens_per_s:,.0f} tokens/s, TTFT p50 "
        f"{level.ttft_p50_ms:.1f} ms, p99 {level.ttft_p99_ms:.1f} ms, {level.failures} failed{cpu}"
    )


def fit(levels: list[Level]) -> dict[str, float]:
    """CPU = a x tokens + b x requests over the mmq levels, by least squares on relative
    errors (each level counts the same, whatever its size): a in µs per token, b in ms per
    request, for the whole of mmq and each role. None without two loads of different
    tokens per request (tokens and requests in proportion cannot be told apart)."""
    import numpy as np

    rows = [lv for lv in levels if lv.target == "mmq" and lv.tokens]
    x = np.array([[lv.tokens, lv.requests - lv.failures] for lv in rows], dtype=float)
    if len(rows) < 2 or np.linalg.matrix_rank(x) < 2:
        return {}
    roles = [by_role(lv.cpu_s) for lv in rows]
    out = {}
    for name in ["total", *roles[0]]:
        y = np.array([sum(r.values()) if name == "total" else r[name] for r in roles])
        weight = 1.0 / np.maximum(np.array([sum(r.values()) for r in roles]), 1e-9)
        (a, b), *_ = np.linalg.lstsq(x * weight[:, None], y * weight, rcond=None)
        out[f"{name}_us_per_token"] = round(float(a) * 1e6, 2)
        out[f"{name}_ms_per_request"] = round(float(b) * 1e3, 3)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.llm_ceiling", description=__doc__)
    parser.add_argument("--loads", default=DEFAULT_LOADS)
    parser.add_argument("--rounds", type=int, default=2, help="requests per stream per level")
    parser.add_argument("--api-workers", type=int, default=1)
    parser.add_argument(
        "--worker-instances", type=int, default=1, help="LLM relay workers per engine"
    )
    parser.add_argument(
        "--no-router", action="store_true", help="without vllm-router's row (PyPI's vllm-router)"
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per engine chunk, as vLLM's flag (the first token at once)",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def router_version() -> str | None:
    """vllm-router's installed version; None where it is not installed."""
    if importlib.util.find_spec("vllm_router") is None:
        return None
    return importlib.metadata.version("vllm-router")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loads = [Load.parse(t) for t in args.loads.split(",")]
    router = router_version() if not args.no_router else None
    if not args.no_router and router is None:
        console.print("vllm-router is not installed (make install adds it): no router row")
    with ExitStack() as stack:
        targets = deploy(
            loads,
            args.api_workers,
            args.worker_instances,
            router is not None,
            stack,
            args.stream_interval,
        )
        levels = asyncio.run(run(args, targets, loads))
    fitted = fit(levels)
    verdicts = report(levels, fitted, GOALS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "meta": run_meta(
            loads=args.loads,
            rounds=args.rounds,
            api_workers=args.api_workers,
            worker_instances=args.worker_instances,
            vllm_router=router,
            stream_interval=args.stream_interval,
        ),
        "goals": GOALS,
        "levels": [asdict(lv) for lv in levels],
        "fit": fitted,
        "verdicts": [asdict(v) for v in verdicts],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
