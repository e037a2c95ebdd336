"""Fair share between keys, measured from outside with the shipped settings: key A submits
a burst at once while key B submits one job a second, with fair share off and on, in one
run.

    python -m bench.fairness [--kind tts|sleep] [--burst 40] [--rounds 5] [--idle-s 5]
                             [--release-interval-s S] [--slots 4] [--service-ms 100]
                             [--out bench/results/fairness.json]

`--kind tts` (the default): the `tts` pipeline as mmq.toml ships it (Piper's `joe`, one
job at a time), each job a short sentence. `--kind sleep`: the tests' `SleepPipeline`
(each job sleeps `--service-ms`) with `--slots` runners on one worker. The scheduler
steps every `batches.release_interval_s` as shipped (0.2 s) unless `--release-interval-s`
says otherwise (the bench's old setting: 0.05).

For each setting (`fairness.enabled` false, then true) a fresh deployment runs: nothing
for `--idle-s` (the scheduler's CPU idle), A's burst alone (A's throughput), then
`--rounds` times A's burst with B's one job a second until the burst is done (the
scheduler's CPU under load). B's job ends long before its next, so each one is a
newcomer's: its key has nothing at the workers when it comes. Reported: B's queue wait
(submit to start) p50, p99 and max against the median run of the jobs beside it (A's and
B's), A's jobs/s alone and beside B, and the scheduler process's CPU (psutil) per second,
idle and loaded. Goals (issues 35 and 55): with fair share, B's wait <= 2x the median
run, and A's throughput >= 0.95x alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from bench.sleepwork import PIPELINE as SLEEP_PIPELINE
from bench.sleepwork import job_input
from jobstore.api_keys import create_key
from tuning.deployment import Deployment, private_deployment

console = Console(width=160)

TTS_PIPELINE = """
[pipelines.tts]
kind = "tts"
impl = "pipelines.tts:TtsPipeline"
max_batch = 1
concurrency = 1

[pipelines.tts.options]
default_voice = "joe"
threads = 0

[pipelines.tts.options.voices.joe]
engine = "piper"
"""
"""The `tts` pipeline as the repository's mmq.toml ships it (one job at a time on every
core), on the voice the package ships."""
TTS_TEXT = "The meeting starts at nine."
WAIT_GOAL = 2.0
"""B's p99 (and max) queue wait, at most this many median runs."""
COLUMNS = ["fairness", "a_jobs_per_s_alone", "a_jobs_per_s_beside_b", "b_jobs",
           "b_wait_p50_ms", "b_wait_p99_ms", "b_wait_max_ms", "run_p50_ms",
           "b_wait_max_over_run", "scheduler_cpu_idle_ms_per_s",
           "scheduler_cpu_loaded_ms_per_s"]  # fmt: skip


@dataclass(frozen=True)
class Work:
    """What the bench runs: the pipeline's config, its worker and one job's body."""

    config: str
    pipeline: str
    body: dict[str, Any]


def _work(args: argparse.Namespace) -> Work:
    if args.kind == "sleep":
        body = {"kind": "sleep", "input": job_input(args.service_ms)}
        return Work(SLEEP_PIPELINE.format(slots=args.slots), "work", body)
    body = {"kind": "tts", "input": {"text": TTS_TEXT, "format": "pcm"}}
    return Work(TTS_PIPELINE, "tts", body)


class CpuClock:
    """A process's CPU seconds (user and system, psutil) against wall seconds."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)

    def _now(self) -> tuple[float, float]:
        times = self.proc.cpu_times()
        return time.monotonic(), times.user + times.system

    @contextmanager
    def window(self, found: list[float]) -> Iterator[None]:
        """Appends CPU milliseconds per wall second over the block to `found`."""
        wall0, cpu0 = self._now()
        yield
        wall1, cpu1 = self._now()
        found.append(1000 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9))


async def _burst(http: httpx.AsyncClient, key: str, n: int, body: dict[str, Any]) -> list[str]:
    headers = {"Authorization": f"Bearer {key}"}
    answers = await asyncio.gather(
        *(http.post("/v1/jobs", json=body, headers=headers) for _ in range(n))
    )
    return [a.json()["id"] for a in answers if a.status_code == 202]


async def _ended(http: httpx.AsyncClient, key: str, ids: list[str]) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}", "Prefer": "wait=60"}
    jobs = []
    for job_id in ids:
        while True:
            r = await http.get(f"/v1/jobs/{job_id}", headers=headers)
            if r.status_code == 200:
                jobs.append(r.json())
                break
    return jobs


def _span_s(jobs: list[dict[str, Any]]) -> float:
    created = min(datetime.fromisoformat(j["created_at"]).timestamp() for j in jobs)
    finished = max(datetime.fromisoformat(j["finished_at"]).timestamp() for j in jobs)
    return finished - created


async def _beside(
    http: httpx.AsyncClient, a_key: str, b_key: str, body: dict[str, Any], burst: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A's burst with B's one job a second until it is done: (A's jobs, B's jobs)."""
    ids = await _burst(http, a_key, burst, body)
    a_task = asyncio.create_task(_ended(http, a_key, ids))
    b_ids = []
    headers = {"Authorization": f"Bearer {b_key}"}
    while not a_task.done():
        r = await http.post("/v1/jobs", json=body, headers=headers)
        b_ids.append(r.json()["id"])
        await asyncio.sleep(1.0)
    return await a_task, await _ended(http, b_key, b_ids)


async def _measure(
    base_url: str, keys: tuple[str, str], cpu: CpuClock, args: argparse.Namespace
) -> dict[str, Any]:
    a_key, b_key = keys
    body = _work(args).body
    limits = httpx.Limits(max_connections=1024)
    idle: list[float] = []
    loaded: list[float] = []
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=limits, trust_env=False
    ) as http:
        await _ended(http, b_key, await _burst(http, b_key, 1, body))  # warm
        with cpu.window(idle):
            await asyncio.sleep(args.idle_s)
        alone = await _ended(http, a_key, await _burst(http, a_key, args.burst, body))
        a_beside: list[dict[str, Any]] = []
        b_jobs: list[dict[str, Any]] = []
        spans = []
        with cpu.window(loaded):
            for _ in range(args.rounds):
                a_jobs, b_round = await _beside(http, a_key, b_key, body, args.burst)
                a_beside += a_jobs
                b_jobs += b_round
                spans.append(_span_s(a_jobs))
    waits = [(j["timings"]["queue_wait_ms"] or 0) / 1000 for j in b_jobs]
    runs = [j["timings"]["run_ms"] for j in a_beside + b_jobs if j["timings"]["run_ms"]]
    run_p50 = statistics.median(runs)
    return {
        "a_jobs_per_s_alone": len(alone) / _span_s(alone),
        "a_jobs_per_s_beside_b": len(a_beside) / sum(spans),
        "b_jobs": len(b_jobs),
        "b_wait_p50_ms": percentile_ms(waits, 50),
        "b_wait_p99_ms": percentile_ms(waits, 99),
        "b_wait_max_ms": max(waits) * 1000,
        "b_waits_ms": [round(w * 1000, 1) for w in waits],
        "run_p50_ms": run_p50,
        "b_wait_p99_over_run": percentile_ms(waits, 99) / run_p50,
        "b_wait_max_over_run": max(waits) * 1000 / run_p50,
        "statuses": sorted({j["status"] for j in a_beside + b_jobs}),
        "scheduler_cpu_idle_ms_per_s": idle[0],
        "scheduler_cpu_loaded_ms_per_s": loaded[0],
    }


def _scheduler_pid(dep: Deployment) -> int:
    (scheduler,) = [p for p in dep.procs if p.name == "scheduler"]
    return scheduler.process.pid


def run_setting(args: argparse.Namespace, fair: bool) -> dict[str, Any]:
    work = _work(args)
    env = {"MMQ_FAIRNESS__ENABLED": "true" if fair else "false", "HF_HUB_OFFLINE": "1",
           "MMQ_QUEUE__MAX_QUEUED": "100000"}  # fmt: skip
    if args.release_interval_s is not None:
        env["MMQ_BATCHES__RELEASE_INTERVAL_S"] = str(args.release_interval_s)
    with private_deployment(
        work.config, env, [work.pipeline], prefix="mmq-fairness-", worker_timeout_s=120
    ) as dep:
        client = redis.Redis.from_url(dep.redis_url, decode_responses=True)
        keys = create_key(client, "team-a"), create_key(client, "team-b")
        console.print(
            f"fair share {'on' if fair else 'off'}: A's {args.burst} {args.kind} jobs at once,"
            f" B one a second, {args.rounds} rounds"
        )
        cpu = CpuClock(_scheduler_pid(dep))
        return {"fairness": fair} | asyncio.run(_measure(dep.base_url, keys, cpu, args))


def _cell(value: object) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--kind", choices=["tts", "sleep"], default="tts")
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument(
        "--release-interval-s",
        type=float,
        default=None,
        help="the scheduler's step (default: as shipped, 0.2 s; the bench's old: 0.05)",
    )
    parser.add_argument("--slots", type=int, default=4, help="--kind sleep: its runners")
    parser.add_argument("--service-ms", type=int, default=100, help="--kind sleep: a job")
    parser.add_argument("--out", type=Path, default=Path("bench/results/fairness.json"))
    args = parser.parse_args(argv)
    rows = [run_setting(args, False), run_setting(args, True)]
    step = args.release_interval_s or "0.2 (shipped)"
    table = Table(
        title=f"Key A: {args.burst} {args.kind} jobs at once, {args.rounds} rounds; key B: "
        f"one a second; release step {step} s (one run)"
    )
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in COLUMNS))
    console.print(table)
    fair = rows[1]
    ratios = {
        "B p99 queue wait / median run (fair share on)": fair["b_wait_p99_over_run"],
        "B max queue wait / median run (fair share on)": fair["b_wait_max_over_run"],
        "A jobs/s beside B / alone (fair share on)": fair["a_jobs_per_s_beside_b"]
        / fair["a_jobs_per_s_alone"],
    }
    for name, value in ratios.items():
        console.print(f"{name}: {value:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "rows": rows,
        "ratios": ratios,
        "goal": f"B's p99 and max queue wait <= {WAIT_GOAL}x the median run",
        "meta": run_meta(),
        "setup": vars(args) | {"out": str(args.out)},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
