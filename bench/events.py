"""Event delivery delay: a worker's publish to a client's receipt, through one API process.

    python -m bench.events [--url http://127.0.0.1:8000 --redis-url redis://...]
                           [--streams 1,100,1000] [--ws 1,100] [--rounds N] [--runs N]
                           [--publish-batch N]
                           [--out bench/results/events.json]

For each level of N concurrent streams it submits N `noop` jobs through the API (no worker
runs, so they stay queued), opens one `GET /v1/jobs/{id}/events` SSE stream per job (or,
for the `--ws` levels, one `/v1/jobs/{id}/ws` websocket per job) and
waits until each stream has replayed its `queued` status event. Then a publisher process
acts as the worker: each round it calls `JobStore.append_event(job, PROGRESS, {"sent_ns":
time.time_ns(), ...})` once per job, and each stream notes `time.time_ns()` when the event
arrives (same machine, same clock). The delay of an event is receipt minus `sent_ns`: the
Lua XADD + PUBLISH, the API's pub/sub connection for events and its fan-out, the SSE write, and
the client's read. Rounds do not overlap: the next one starts after every event of the
last one has arrived (or the round timed out) and a short pause. A warm-up round is not
counted. At the end each job is cancelled, so its stream ends on the terminal status.

Goals: p50 <= 2 ms at 1 stream and <= 20 ms at 1000 streams; at 1000 SSE streams, at
least 11,200 events/s through the one API process (4x the 2,800 before issue 31), in every
one of `--runs` runs. Each level says what bound its events/s: the API, or the publisher
(the API received at least 0.9x what the publisher sent: its pace was the limit, and the
API's own is not known from that level). One append at a time, the publisher manages about
4,000 a second on a 2-core machine beside the API: `--publish-batch 64` writes as a
worker's event writer does, a call for many events, to find the API's own limit. It also
reports the API process's RSS (when it started the API) and the Redis connections during
each level, to show that an idle stream costs little memory and no Redis connection of its
own.

Without `--url` it starts Redis and one API process on free ports (auth off, 127.0.0.1)
and stops them at the end. Each stream is a socket on both sides: the open-file limit of
this process is raised to its hard limit, and the API started here inherits it. With
`--url` the API must allow as many open files as streams, its queue limit for `noop`
(`queue.max_queued`) must admit the largest level, and no `noop` worker may be running
(it would finish the jobs and end the streams before the rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import resource
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from redis.exceptions import RedisError

from bench.common import percentile_ms
from bench.events_publisher import BENCH_CLIENT_PREFIX, Publisher, publisher_process
from bench.events_report import (
    GOALS_EVENTS_PER_S,
    GOALS_P50_MS,
    LevelResult,
    RedisClients,
    console,
    print_progress,
    print_report,
    write_json,
)
from bench.events_streams import (
    REQUEST_LANES,
    Stream,
    Tracker,
    cancel_jobs,
    http_client,
    open_streams,
    submit_jobs,
)
from bench.overhead import parse_levels, processes, resolve_redis

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "mmq.toml"
DEFAULT_OUT = Path("bench/results/events.json")
PROBE_CLIENT = f"{BENCH_CLIENT_PREFIX}-probe"
FDS_PER_STREAM = 2
FD_MARGIN = 512
MAX_ERRORS_KEPT = 8


# --- command line ----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.events", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", help="base URL of a running API (default: start one here)")
    parser.add_argument(
        "--redis-url", help="its Redis (default with --url: MMQ_REDIS_URL or the config's)"
    )
    parser.add_argument(
        "--streams", type=parse_levels, default=[1, 100, 1000], help="SSE levels, e.g. 1,1000"
    )
    parser.add_argument(
        "--ws",
        type=lambda text: [] if text in ("", "none") else parse_levels(text),
        default=[1, 100],
        help="websocket levels (default 1,100; 'none' for none)",
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="whole runs, each on a fresh Redis and API"
    )
    parser.add_argument(
        "--publish-batch",
        type=int,
        default=1,
        help="events per append call (1: one at a time; a worker writes up to 512 at once)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="measured rounds per level (default: 50 at 1 stream, down to 10 at 1000)",
    )
    parser.add_argument("--gap-ms", type=float, default=50.0, help="pause between rounds")
    parser.add_argument("--round-timeout-s", type=float, default=10.0)
    parser.add_argument(
        "--open-lanes", type=int, default=64, help="streams opened at a time (default 64)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="mmq TOML config")
    parser.add_argument(
        "--log-level", default="WARNING", help="log level of the processes started here"
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.open_lanes < 1:
        parser.error("--open-lanes must be >= 1")
    return args


def rounds_for(args: argparse.Namespace, streams: int) -> int:
    if args.rounds is not None:
        return int(args.rounds)
    return max(10, min(50, 10_000 // streams))


# --- probes: the API's memory, Redis's connections -------------------------------------


def rss_kb(pid: int | None) -> int | None:
    """VmRSS of a process in kB; None when unknown."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds a process has used; None when unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def redis_clients(probe: redis.Redis) -> RedisClients:
    clients = probe.client_list()
    bench = sum(1 for c in clients if str(c.get("name", "")).startswith(BENCH_CLIENT_PREFIX))
    subscribers = sum(1 for c in clients if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0)
    return RedisClients(len(clients), bench, len(clients) - bench, subscribers)


# --- one level -------------------------------------------------------------------------


@dataclass
class Context:
    """What every level uses."""

    args: argparse.Namespace
    api_url: str
    publisher: Publisher
    probe: redis.Redis
    api_pid: int | None
    check: Callable[[], None]
    """Raises when a process started here died."""


@dataclass
class Rounds:
    """The publisher's side of a level's measured rounds."""

    published: int = 0
    publish_s: float = 0.0
    all_published: int = 0
    """Warm-up round included (the API's CPU is measured over every round)."""
    timeouts: int = 0
    errors: Counter[str] = field(default_factory=Counter)


async def run_round(
    ctx: Context, round_no: int, live: list[Stream], tracker: Tracker, rounds: Rounds
) -> None:
    """Publish one event per live stream and wait until all have arrived (or time out)."""
    tracker.expect(len(live))
    report = await asyncio.to_thread(ctx.publisher.publish, round_no, [s.job_id for s in live])
    tracker.forgo(len(live) - report.published)
    try:
        await asyncio.wait_for(tracker.done.wait(), ctx.args.round_timeout_s)
    except TimeoutError:
        rounds.timeouts += 1
    rounds.all_published += report.published
    if round_no > 0:
        rounds.published += report.published
        rounds.publish_s += report.elapsed_s
        rounds.errors.update(report.errors)
    await asyncio.sleep(ctx.args.gap_ms / 1000)
    ctx.check()


@dataclass
class Receipts:
    """The measured events of a level, parsed after its rounds."""

    delays_s: list[float] = field(default_factory=list)
    received: int = 0
    duplicates: int = 0
    misrouted: int = 0
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Round -> (first sent_ns, last receipt ns)."""


def collect(streams: list[Stream]) -> Receipts:
    out = Receipts()
    for stream in streams:
        seen: set[int] = set()
        for received_ns, raw in stream.received:
            event = json.loads(raw)
            data = event["data"]
            round_no, sent_ns = int(data["round"]), int(data["sent_ns"])
            if event["job_id"] != stream.job_id:
                out.misrouted += 1
                continue
            if round_no in seen:
                out.duplicates += 1
                continue
            seen.add(round_no)
            if round_no == 0:
                continue  # warm-up
            out.received += 1
            out.delays_s.append((received_ns - sent_ns) / 1e9)
            first, last = out.spans.get(round_no, (sent_ns, received_ns))
            out.spans[round_no] = (min(first, sent_ns), max(last, received_ns))
    return out


def level_errors(streams: list[Stream], receipts: Receipts, rounds: Rounds) -> Counter[str]:
    errors: Counter[str] = Counter(s.error for s in streams if s.error)
    errors.update(rounds.errors)
    if receipts.duplicates:
        errors["duplicate events"] += receipts.duplicates
    if receipts.misrouted:
        errors["events on the wrong stream"] += receipts.misrouted
    if rounds.timeouts:
        errors["rounds that timed out"] += rounds.timeouts
    return errors


def summarize(
    transport: str,
    streams: list[Stream],
    rounds_count: int,
    rounds: Rounds,
    open_s: float,
    extra_errors: list[str],
) -> LevelResult:
    receipts = collect(streams)
    errors = level_errors(streams, receipts, rounds)
    errors.update(extra_errors)
    missing = max(0, rounds.published - receipts.received)
    if missing:
        errors["events published but not received"] += missing
    broken = sum(1 for s in streams if s.error)
    failures = missing + broken + len(extra_errors) + sum(rounds.errors.values())
    span_s = sum(last - first for first, last in receipts.spans.values()) / 1e9
    delays = receipts.delays_s
    goal = GOALS_P50_MS.get(len(streams)) if transport == "sse" else None
    p50 = percentile_ms(delays, 50)
    return LevelResult(
        streams=len(streams),
        transport=transport,
        rounds=rounds_count,
        published=rounds.published,
        received=receipts.received,
        failures=failures,
        p50_ms=p50,
        p90_ms=percentile_ms(delays, 90),
        p99_ms=percentile_ms(delays, 99),
        max_ms=max(delays) * 1000 if delays else math.nan,
        mean_ms=statistics.fmean(delays) * 1000 if delays else math.nan,
        events_per_s=receipts.received / span_s if span_s > 0 else 0.0,
        publish_per_s=rounds.published / rounds.publish_s if rounds.publish_s > 0 else 0.0,
        open_s=open_s,
        goal_p50_ms=goal,
        goal_met=None if goal is None else p50 <= goal,
        goal_events_per_s=GOALS_EVENTS_PER_S.get(len(streams)) if transport == "sse" else None,
        errors=dict(errors.most_common(MAX_ERRORS_KEPT)),
    )


async def close_streams(
    control: httpx.AsyncClient, streams: list[Stream], tasks: list[asyncio.Task[None]]
) -> list[str]:
    """Cancel every job (a terminal status ends its stream); wait for the streams to end."""
    errors = await cancel_jobs(control, [s.job_id for s in streams])
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        errors += ["stream still open 30s after its job was cancelled"] * len(pending)
    return errors


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """No garbage collection in this process while it measures: a full collection over
    1000 streams' objects pauses the client for milliseconds, which would be counted as
    delivery delay. The rounds make few objects and no cycles worth collecting."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def measure_rounds(
    ctx: Context, streams: list[Stream], tracker: Tracker, rounds_count: int
) -> Rounds:
    rounds = Rounds()
    live = [s for s in streams if s.ready and not s.error]
    if not live:
        return rounds
    with quiet_gc():
        for round_no in range(rounds_count + 1):  # round 0: warm-up
            live = [s for s in live if not s.error]
            await run_round(ctx, round_no, live, tracker, rounds)
    return rounds


async def run_level(ctx: Context, transport: str, count: int) -> LevelResult:
    """Submit, open, measure, cancel (submits and cancels on a small client of their own)."""
    rounds_count = rounds_for(ctx.args, count)
    tracker = Tracker()
    rss: dict[str, int | None] = {}
    async with AsyncExitStack() as stack:
        control = await stack.enter_async_context(http_client(ctx.api_url, REQUEST_LANES))
        job_ids = await submit_jobs(control, count)
        rss["before_streams"] = rss_kb(ctx.api_pid)
        start = time.perf_counter()
        lanes = ctx.args.open_lanes
        streams, tasks = await open_streams(stack, ctx.api_url, job_ids, tracker, lanes, transport)
        open_s = time.perf_counter() - start
        ctx.check()
        rss["streams_open"] = rss_kb(ctx.api_pid)
        clients = redis_clients(ctx.probe)
        cpu_before = cpu_s(ctx.api_pid)
        rounds = await measure_rounds(ctx, streams, tracker, rounds_count)
        cpu_after = cpu_s(ctx.api_pid)
        rss["after_rounds"] = rss_kb(ctx.api_pid)
        close_errors = await close_streams(control, streams, tasks)
    result = summarize(transport, streams, rounds_count, rounds, open_s, close_errors)
    result.api_rss_kb = rss
    result.redis_clients = clients
    if cpu_before is not None and cpu_after is not None and rounds.all_published:
        result.api_cpu_us_per_event = (cpu_after - cpu_before) / rounds.all_published * 1e6
    return result


async def run_levels(ctx: Context) -> list[LevelResult]:
    results = []
    levels = [("sse", n) for n in ctx.args.streams] + [("ws", n) for n in ctx.args.ws]
    for transport, count in levels:
        console.print(f"  {count} {transport} stream(s): submitting, opening, measuring...")
        result = await run_level(ctx, transport, count)
        print_progress(result)
        results.append(result)
    return results


# --- deployment ------------------------------------------------------------------------


def raise_nofile_limit(needed: int) -> tuple[int, int]:
    """Raise this process's open-file limit to its hard limit; children inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        console.print(f"[yellow]open-file limit {soft} < {needed} needed; streams may fail")
    return soft, hard


@dataclass
class Deployment:
    api_url: str
    redis_url: str
    api_pid: int | None
    """The API process when started here (its RSS is reported), else None."""
    check: Callable[[], None]


def deploy(args: argparse.Namespace, stack: ExitStack) -> Deployment:
    """Redis and the API, started here unless given (each stop registered on `stack`)."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-bench-")))
    redis_url = resolve_redis(args, stack, tmp)
    if args.url:
        return Deployment(str(args.url).rstrip("/"), redis_url, None, lambda: None)
    queued = str(2 * max(args.streams) + 100)
    streams = str(max(args.streams + args.ws) + 100)  # one key holds every stream
    procs = processes(
        args, stack, redis_url, tmp, MMQ_QUEUE__MAX_QUEUED=queued,
        MMQ_API__MAX_STREAMS_PER_KEY=streams,
    )  # fmt: skip
    api = procs.start_api(timeout_s=60)
    return Deployment(procs.base_url, redis_url, api.process.pid, procs.check_alive)


def run_async(ctx: Context) -> list[LevelResult]:
    """The levels on uvloop when it is installed (less client-side overhead), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_levels(ctx))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_levels(ctx))


def bench(args: argparse.Namespace) -> tuple[Deployment, list[LevelResult]]:
    """Start what is needed, measure every level, stop what was started."""
    with ExitStack() as stack:
        deployment = deploy(args, stack)
        console.print(f"api {deployment.api_url}  redis {deployment.redis_url}")
        publisher = stack.enter_context(
            publisher_process(args.config, deployment.redis_url, args.publish_batch)
        )
        probe = redis.Redis.from_url(
            deployment.redis_url, decode_responses=True, client_name=PROBE_CLIENT
        )
        stack.callback(probe.close)
        ctx = Context(
            args, deployment.api_url, publisher, probe, deployment.api_pid, deployment.check
        )
        results = run_async(ctx)
        console.print("stopping...")
    return deployment, results


def run_meta(args: argparse.Namespace, deployment: Deployment) -> dict[str, Any]:
    return {
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "api_url": deployment.api_url,
        "redis_url": deployment.redis_url,
        "started_api": deployment.api_pid is not None,
        "streams_levels": args.streams,
        "ws_levels": args.ws,
        "gap_ms": args.gap_ms,
        "round_timeout_s": args.round_timeout_s,
        "open_lanes": args.open_lanes,
        "bench_gc": "frozen and disabled in this process during the rounds",
        "nofile_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "log_level": args.log_level,
    }


# --- main ------------------------------------------------------------------------------


def _sigterm_as_sigint(signum: int, frame: FrameType | None) -> None:
    """SIGTERM stops the run as Ctrl-C does (everything started here is stopped)."""
    signal.raise_signal(signal.SIGINT)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    raise_nofile_limit(FDS_PER_STREAM * max(args.streams) + FD_MARGIN)
    results: list[LevelResult] = []
    try:
        for run in range(1, args.runs + 1):
            deployment, levels = bench(args)
            results += [replace(level, run=run) for level in levels]
    except KeyboardInterrupt:
        console.print("[red]interrupted; everything started here is stopped[/red]")
        return 130
    except (RuntimeError, TimeoutError, RedisError, httpx.HTTPError) as exc:
        console.print(f"[red]bench failed: {type(exc).__name__}: {exc}[/red]")
        return 1
    write_json(args.out, run_meta(args, deployment), results)
    print_report(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
