"""mmq's own overhead: no-op jobs through the HTTP API beside bare Celery and bare Redis.

    python -m bench.overhead [--url http://127.0.0.1:8000] [--requests N] [--rounds N]
                             [--concurrency 1,8,64] [--out bench/results/overhead.json]

At each concurrency level it measures, in the same run and on the same Redis:

- mmq:    `POST /v1/jobs` of a `noop` job with `Prefer: wait=30`, submit to done (200
          with status succeeded);
- celery: a no-op Celery task on mmq's Celery configuration, sent to a threads-pool
          worker that tells the client it ran by an RPUSH the client BLPOPs;
- redis:  a PING round trip (redis-py asyncio).

Celery and Redis are the floor. Goal: mmq's p50 at concurrency 1 within 2x of Celery's,
and mmq's best throughput at least half of Celery's. With `--rounds N` the targets take
turns within a level, in N blocks each (fewer where a block would be under 8 requests
per lane, so that a saturated level is measured in one block), so that a slow spell of
a shared machine falls on all of them rather than on whichever ran then. Without `--url`
it starts its own deployment on free ports (Redis, the API, one noop worker) and stops it
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import redis
import redis.asyncio as aredis
from rich.console import Console
from rich.table import Table

from bench.celery_floor import FloorClient, new_reply_key
from bench.common import REPO, LevelSummary, measure, run_level, summarize
from host.redis_server import RedisServer
from jobs.settings import Settings, load_settings
from tuning.deployment import Deployment as Processes
from tuning.load import Call, RequestResult

DEFAULT_CONFIG = REPO / "mmq.toml"
DEFAULT_OUT = Path("bench/results/overhead.json")
NOOP_KIND = "noop"
WAIT_S = 30
P50_GOAL = 2.0
THROUGHPUT_GOAL = 0.5

console = Console()


@dataclass
class Deployment:
    """What the bench talks to."""

    api_url: str
    redis_url: str
    settings: Settings
    started_api: bool
    """Whether this run started the API and the noop worker (no `--url`)."""
    worker_concurrency: int
    """Threads of the noop pipeline's worker, and so of the Celery floor worker."""
    durable_api_url: str = ""
    """A second API and noop worker on their own Redis at `--durability` (else empty)."""
    durable_level: str = ""


@dataclass
class Ratios:
    """The goal's ratios: mmq against the bare Celery floor."""

    p50_concurrency: int
    p50_ratio: float
    """mmq p50 / Celery p50 at the lowest concurrency level."""
    throughput_ratio: float
    """mmq best jobs/s / Celery best jobs/s over all levels."""
    p50_goal_met: bool
    throughput_goal_met: bool


# --- command line ----------------------------------------------------------------------


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return levels


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", help="base URL of a running API (default: start one here)")
    parser.add_argument(
        "--redis-url",
        help="Redis for the floors (default with --url: MMQ_REDIS_URL, else start one here)",
    )
    parser.add_argument("--requests", type=int, default=1000, help="requests per level, per target")
    parser.add_argument("--concurrency", type=parse_levels, default=[1, 8, 64])
    parser.add_argument(
        "--rounds", type=int, default=1, help="blocks per target per level, taking turns"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="mmq TOML config")
    parser.add_argument(
        "--log-level", default="WARNING", help="log level of the processes started here"
    )
    parser.add_argument(
        "--durability",
        choices=["fsync", "replica"],
        help="also measure a second deployment at this redis.durability (target mmq-LEVEL, "
        "on its own server: appendfsync always for fsync, one replica for replica); `mmq` "
        "then runs on a server with appendonly yes / everysec, as a production `memory` "
        "deployment would",
    )
    args = parser.parse_args(argv)
    if args.durability and args.url:
        parser.error("--durability starts its own deployments: leave out --url")
    if args.requests < 1:
        parser.error("--requests must be >= 1")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    return args


# --- deployment ------------------------------------------------------------------------


def noop_pipeline(settings: Settings) -> tuple[str, int] | None:
    """Name and concurrency of the first enabled pipeline of the noop kind."""
    for name, pipeline in settings.enabled_pipelines.items():
        if pipeline.kind == NOOP_KIND:
            return name, pipeline.concurrency
    return None


def processes(
    args: argparse.Namespace, stack: ExitStack, redis_url: str, tmp: Path, **env: str
) -> Processes:
    """The processes of `--config` on `redis_url` (none started yet; stopped by `stack`):
    on loopback, without keys, at `--log-level`, with `env` over that."""
    env = {
        "MMQ_LOG_LEVEL": args.log_level.upper(),
        "MMQ_API__HOST": "127.0.0.1",
        "MMQ_AUTH__REQUIRED": "false",
        **env,
    }
    procs = Processes(redis_url, tmp, env, config=args.config.read_text(), test_pipelines=False)
    stack.callback(procs.stop)
    return procs


def start_mmq(procs: Processes, pipeline: str, settings: Settings) -> None:
    """The API, with every other enabled pipeline off (so that `/readyz` asks for a noop
    worker alone), and the noop worker."""
    off = [name for name, p in settings.enabled_pipelines.items() if p.kind != NOOP_KIND]
    procs.spawn("api", "api", env={f"MMQ_PIPELINES__{n.upper()}__ENABLED": "false" for n in off})
    procs.start_worker(pipeline, wait=False)


def resolve_redis(args: argparse.Namespace, stack: ExitStack, tmp: Path) -> str:
    """The Redis URL to use; starts a private server when none is given."""
    url = args.redis_url or (load_settings(args.config).redis_url if args.url else None)
    if url:
        return str(url)
    server = RedisServer(tmp / "redis", persist=bool(getattr(args, "durability", None)))
    server.start()
    stack.callback(server.stop)
    return server.url


def deploy(args: argparse.Namespace, stack: ExitStack) -> tuple[Deployment, Processes]:
    """Start what the run needs (each stop registered on `stack`); returns it and its procs."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-bench-")))
    redis_url = resolve_redis(args, stack, tmp)
    settings = load_settings(args.config, redis_url=redis_url)
    found = noop_pipeline(settings)
    if found is None and not args.url:
        raise SystemExit(f"no enabled pipeline of kind {NOOP_KIND!r} in {args.config}")
    name, concurrency = found or ("", 32)
    procs = processes(args, stack, redis_url, tmp)
    floor = [sys.executable, "-m", "bench.celery_floor", "--concurrency", str(concurrency)]
    procs.launch("celery floor", floor)
    api_url = str(args.url or "").rstrip("/")
    if not args.url:
        start_mmq(procs, name, settings)
        api_url = procs.base_url
    deployment = Deployment(api_url, redis_url, settings, not args.url, concurrency)
    if args.durability:
        deployment.durable_api_url = deploy_durable(args, stack, tmp, name, settings)
        deployment.durable_level = args.durability
    return deployment, procs


def deploy_durable(
    args: argparse.Namespace, stack: ExitStack, tmp: Path, pipeline: str, settings: Settings
) -> str:
    """An API and noop worker at `args.durability` on their own server; its URL (ready)."""
    server = RedisServer(tmp / f"redis-{args.durability}", fsync_always=args.durability == "fsync")
    server.start()
    stack.callback(server.stop)
    if args.durability == "replica":
        replica = RedisServer(
            tmp / "redis-replica", extra_args=["--replicaof", "127.0.0.1", str(server.port)]
        )
        replica.start()
        stack.callback(replica.stop)
        wait_in_sync(replica)
    (tmp / "durable").mkdir()
    procs = processes(
        args, stack, server.url, tmp / "durable", MMQ_REDIS__DURABILITY=args.durability
    )
    start_mmq(procs, pipeline, settings)
    procs.wait_ready()
    return procs.base_url


def wait_in_sync(replica: RedisServer, timeout_s: float = 30.0) -> None:
    client = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + timeout_s
    while client.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica did not sync in {timeout_s:g}s")
        time.sleep(0.1)


def wait_floor_ready(floor: FloorClient, procs: Processes, timeout_s: float = 60.0) -> None:
    """Send one floor task and wait until the floor worker has run it."""
    key = new_reply_key()
    floor.send(key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check_alive()
        if floor.wait(key, 0.5):
            return
    raise RuntimeError(f"the Celery floor worker ran no task in {timeout_s:g}s")


# --- targets ---------------------------------------------------------------------------


async def submit_noop(session: aiohttp.ClientSession) -> str | None:
    """One noop job, submit to done."""
    async with session.post(
        "/v1/jobs",
        json={"kind": NOOP_KIND, "input": {"payload": "x"}},
        headers={"Prefer": f"wait={WAIT_S}"},
    ) as response:
        if response.status != 200:
            return f"HTTP {response.status}: {(await response.text())[:120]}"
        status = (await response.json()).get("status")
    return None if status == "succeeded" else f"status {status}"


async def ping(client: aredis.Redis) -> str | None:
    return None if await client.ping() else "PING answered false"


async def open_targets(
    stack: AsyncExitStack, deployment: Deployment, floor: FloorClient, lanes: int
) -> dict[str, Call]:
    """The call of each target, its clients closed by `stack`."""
    # aiohttp, not httpx: at 64 lanes httpx's pool took ~10 ms of CPU per request here,
    # enough to make the client the bottleneck (aiohttp: ~0.5 ms).
    http = await stack.enter_async_context(
        aiohttp.ClientSession(
            deployment.api_url,
            timeout=aiohttp.ClientTimeout(total=WAIT_S + 30.0),
            connector=aiohttp.TCPConnector(limit=lanes),
        )
    )
    rds = aredis.Redis.from_url(deployment.redis_url)
    stack.push_async_callback(rds.aclose)
    calls: dict[str, Call] = {"mmq": lambda: submit_noop(http)}
    if deployment.durable_api_url:
        durable = await stack.enter_async_context(
            aiohttp.ClientSession(
                deployment.durable_api_url,
                timeout=aiohttp.ClientTimeout(total=WAIT_S + 30.0),
                connector=aiohttp.TCPConnector(limit=lanes),
            )
        )
        calls[f"mmq-{deployment.durable_level}"] = lambda: submit_noop(durable)
    return calls | {"celery": floor.call, "redis": lambda: ping(rds)}


def rounds_at(concurrency: int, requests: int, rounds: int) -> int:
    """Blocks per target at a level: `rounds`, or fewer so that each block keeps at
    least 8 requests per lane (ramp-up and drain would otherwise skew jobs/s)."""
    return max(1, min(rounds, requests // (8 * concurrency)))


async def run_levels(
    deployment: Deployment, floor: FloorClient, args: argparse.Namespace
) -> list[LevelSummary]:
    """Every target at every level, after a warm-up at the highest level; within a level
    the targets take turns, block by block, and each target's blocks are pooled."""
    levels: list[int] = args.concurrency
    summaries: list[LevelSummary] = []
    async with AsyncExitStack() as stack:
        calls = await open_targets(stack, deployment, floor, max(levels))
        for target, call in calls.items():
            await measure(target, call, 2 * max(levels), max(levels))
        for concurrency in levels:
            rounds = rounds_at(concurrency, args.requests, args.rounds)
            pooled: dict[str, tuple[list[RequestResult], float]] = {t: ([], 0.0) for t in calls}
            for block in split(args.requests, rounds):
                for target in calls:
                    results, duration_s = await run_level(calls[target], block, concurrency)
                    done, spent = pooled[target]
                    pooled[target] = (done + results, spent + duration_s)
            for target in calls:
                summary = summarize(target, concurrency, *pooled[target])
                print_progress(summary)
                summaries.append(summary)
    return summaries


def split(requests: int, rounds: int) -> list[int]:
    """`requests` in `rounds` blocks as even as can be."""
    base, extra = divmod(requests, rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


# --- report ----------------------------------------------------------------------------


def find(summaries: list[LevelSummary], target: str) -> list[LevelSummary]:
    return [s for s in summaries if s.target == target]


def compute_ratios(summaries: list[LevelSummary]) -> Ratios:
    mmq, celery = find(summaries, "mmq"), find(summaries, "celery")
    low = min(s.concurrency for s in mmq)
    mmq_p50 = next(s.p50_ms for s in mmq if s.concurrency == low)
    celery_p50 = next(s.p50_ms for s in celery if s.concurrency == low)
    best_mmq = max(s.throughput for s in mmq)
    best_celery = max(s.throughput for s in celery)
    p50_ratio = mmq_p50 / celery_p50 if celery_p50 > 0 else math.nan
    tput_ratio = best_mmq / best_celery if best_celery > 0 else math.nan
    return Ratios(
        p50_concurrency=low,
        p50_ratio=p50_ratio,
        throughput_ratio=tput_ratio,
        p50_goal_met=p50_ratio <= P50_GOAL,
        throughput_goal_met=tput_ratio >= THROUGHPUT_GOAL,
    )


def durability_ratios(summaries: list[LevelSummary]) -> dict[str, float]:
    """mmq at `--durability` against mmq at `memory`, per level: jobs/s and p50."""
    durable = [s for s in summaries if s.target.startswith("mmq-")]
    base = {s.concurrency: s for s in find(summaries, "mmq")}
    ratios: dict[str, float] = {}
    for s in durable:
        b = base[s.concurrency]
        ratios[f"c={s.concurrency} {s.target}/mmq jobs/s"] = s.throughput / b.throughput
        ratios[f"c={s.concurrency} {s.target}/mmq p50"] = s.p50_ms / b.p50_ms
    return ratios


def print_progress(s: LevelSummary) -> None:
    console.print(
        f"  c={s.concurrency:<3} {s.target:<10} {s.throughput:9.1f} jobs/s  "
        f"p50 {s.p50_ms:8.2f} ms  failures {s.failures}",
        highlight=False,
    )


def results_table(summaries: list[LevelSummary]) -> Table:
    table = Table(title="mmq overhead (no-op jobs) vs bare Celery and bare Redis")
    for column in ("concurrency", "target", "jobs/s", "p50 ms", "p95 ms", "p99 ms", "failures"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for concurrency in sorted({s.concurrency for s in summaries}):
        for s in (s for s in summaries if s.concurrency == concurrency):
            table.add_row(
                str(concurrency),
                s.target,
                f"{s.throughput:,.1f}",
                f"{s.p50_ms:.2f}",
                f"{s.p95_ms:.2f}",
                f"{s.p99_ms:.2f}",
                str(s.failures),
                style="red" if s.failures else None,
            )
        table.add_section()
    return table


def verdict(met: bool) -> str:
    return "[green]met[/green]" if met else "[red]not met[/red]"


def print_report(summaries: list[LevelSummary], ratios: Ratios, out: Path) -> None:
    console.print()
    console.print(results_table(summaries))
    console.print(
        f"mmq p50 / celery p50 at concurrency {ratios.p50_concurrency}: "
        f"{ratios.p50_ratio:.2f}x  (goal <= {P50_GOAL:g}x: {verdict(ratios.p50_goal_met)})"
    )
    console.print(
        f"mmq best jobs/s / celery best jobs/s: {ratios.throughput_ratio:.2f}  "
        f"(goal >= {THROUGHPUT_GOAL:g}: {verdict(ratios.throughput_goal_met)})"
    )
    for name, value in durability_ratios(summaries).items():
        console.print(f"{name}: {value:.2f}")
    for s in summaries:
        for error, count in s.errors.items():
            console.print(f"[red]{s.target} c={s.concurrency}: {count} x {error}[/red]")
    console.print(f"results written to {out}")


def jsonable(value: Any) -> Any:
    """NaN and infinities as null, floats rounded, containers walked."""
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def run_meta(args: argparse.Namespace, deployment: Deployment) -> dict[str, Any]:
    return {
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "api_url": deployment.api_url,
        "redis_url": deployment.redis_url,
        "started_deployment": deployment.started_api,
        "worker_concurrency": deployment.worker_concurrency,
        "requests_per_level": args.requests,
        "concurrency_levels": args.concurrency,
        "rounds_per_level": {
            str(c): rounds_at(c, args.requests, args.rounds) for c in args.concurrency
        },
        "log_level": args.log_level,
        "wait_s": WAIT_S,
    }


def write_json(
    out: Path, meta: dict[str, Any], summaries: list[LevelSummary], ratios: Ratios
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "goals": {"p50_ratio_max": P50_GOAL, "throughput_ratio_min": THROUGHPUT_GOAL},
        "ratios": asdict(ratios),
        "durability_ratios": durability_ratios(summaries),
        "results": [asdict(s) for s in summaries],
    }
    out.write_text(json.dumps(jsonable(payload), indent=2) + "\n")


# --- main ------------------------------------------------------------------------------


def _sigterm_as_sigint(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the run as Ctrl-C does (asyncio.run cancels its task cleanly then)."""
    signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def floor_client(deployment: Deployment, lanes: int) -> Iterator[FloorClient]:
    client = FloorClient(deployment.settings, threads=lanes, timeout_s=WAIT_S)
    try:
        yield client
    finally:
        client.close()


def bench(args: argparse.Namespace) -> tuple[Deployment, list[LevelSummary]]:
    """Start what is needed, measure everything, stop what was started."""
    with ExitStack() as stack:
        deployment, procs = deploy(args, stack)
        floor = stack.enter_context(floor_client(deployment, max(args.concurrency)))
        console.print(f"api {deployment.api_url}  redis {deployment.redis_url}")
        procs.wait_ready(url=deployment.api_url)
        wait_floor_ready(floor, procs)
        console.print(f"ready; {args.requests} requests per level, levels {args.concurrency}")
        summaries = asyncio.run(run_levels(deployment, floor, args))
        console.print("stopping...")
    return deployment, summaries


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    try:
        deployment, summaries = bench(args)
    except KeyboardInterrupt:
        console.print("[red]interrupted; everything started here is stopped[/red]")
        return 130
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[red]bench failed: {exc}[/red]")
        return 1
    ratios = compute_ratios(summaries)
    write_json(args.out, run_meta(args, deployment), summaries, ratios)
    print_report(summaries, ratios, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
