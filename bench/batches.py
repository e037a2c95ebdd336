"""A batch filling idle time, measured: interactive traffic alone, then the same traffic
with a batch running, on a pipeline of known cost, in one run.

    python -m bench.batches [--lines 2000] [--slots 8] [--service-ms 100] [--step-ms 50]
                            [--load 0.5] [--seconds 20] [--reserve N] [--preempt]
                            [--out bench/results/batches.json]

The pipeline is the tests' `SleepPipeline` (each job sleeps `--service-ms`, in steps of
`--step-ms`, where a preempted line stops), with
`--slots` runners on one worker: its capacity is slots / service time. Interactive jobs
arrive as a Poisson process at `--load` of that capacity, for `--seconds`, each
submitted with `Prefer: wait` (its latency is submit to answer, as a client sees it).
The second run starts a batch of `--lines` lines of the same job (`/v1/jobs`) with the
interactive traffic, which goes on until the batch ends.

First, the Redis memory a waiting line costs (a batch of `--memory-lines` lines whose
pipeline has no worker, then canceled). Reported: interactive p50/p99 (and queue wait)
alone and with the batch, and their ratios; the worker's busy share while the batch had
work (the jobs' run time over slots x that time); and the batch's duration over what the
idle capacity allows (lines x service time / (slots x (1 - load))). Goals (issue 34): p50
and p99 within 1.10x, busy >= 95 %, duration <= 1.15x. With `--preempt`
(`batches.preempt`), busy counts the runs that ended a job: the part of a line that a
preemption threw away is not counted, and the lines it preempted are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from bench.sleepwork import job_body, job_input, sleep_deployment
from jobs import keys
from jobstore.api_keys import create_key

console = Console(width=140)


@dataclass
class Interactive:
    latencies_s: list[float]
    queue_waits_s: list[float]
    failures: int
    windows: list[tuple[float, float]]
    """(started_at, finished_at) of each job's run."""


async def interactive_load(
    http: httpx.AsyncClient, rate: float, body: dict[str, Any], until: Any, seed: int
) -> Interactive:
    """Poisson arrivals of `body` at `rate` per second until `until()` is true."""
    rng = random.Random(seed)
    result = Interactive([], [], 0, [])

    async def one() -> None:
        start = time.perf_counter()
        r = await http.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"})
        job = r.json()
        if r.status_code != 200 or job.get("status") != "succeeded":
            result.failures += 1
            return
        result.latencies_s.append(time.perf_counter() - start)
        result.queue_waits_s.append((job["timings"]["queue_wait_ms"] or 0) / 1000)
        result.windows.append((_ts(job["started_at"]), _ts(job["finished_at"])))

    tasks = []
    while not until():
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return result


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


async def run_batch(
    http: httpx.AsyncClient, lines: int, inp: dict[str, Any]
) -> tuple[dict[str, Any], list[tuple[float, float]]]:
    text = "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/jobs",
                "body": {"kind": "sleep", "input": inp},
            }
        )
        + "\n"
        for i in range(lines)
    )
    files = {"file": ("batch.jsonl", text.encode(), "application/jsonl")}
    source = (await http.post("/v1/files", files=files, data={"purpose": "batch"})).json()
    create = {"input_file_id": source["id"], "endpoint": "/v1/jobs", "completion_window": "24h"}
    batch = (await http.post("/v1/batches", json=create)).json()
    while batch["status"] not in {"completed", "failed", "cancelled", "expired"}:
        await asyncio.sleep(0.5)
        batch = (await http.get(f"/v1/batches/{batch['id']}")).json()
    output = (await http.get(f"/v1/files/{batch['output_file_id']}/content")).text
    windows = []
    for line in output.splitlines():
        job = json.loads(line)["response"]["body"]
        windows.append((_ts(job["started_at"]), _ts(job["finished_at"])))
        batch.setdefault("job_ids", []).append(job["id"])
    return batch, windows


def memory_of_ended_line(r: redis.Redis, job_ids: list[str]) -> float:
    """Mean bytes that an ended line's job keeps in Redis until `job_ttl_s` (its record
    and its events), over a sample of them."""
    sample = job_ids[:50]
    total = 0
    for job_id in sample:
        for key in (keys.job(job_id), keys.job_events(job_id)):
            total += int(r.memory_usage(key) or 0)
    return total / len(sample) if sample else 0.0


async def memory_of_waiting_lines(http: httpx.AsyncClient, r: redis.Redis, lines: int) -> float:
    """Bytes of Redis memory per waiting line: a batch of `lines` lines for a pipeline
    with no worker (the tests' `sleep`: its lines wait), measured, then canceled."""
    text = "".join(
        json.dumps(
            {
                "custom_id": f"m{i}",
                "method": "POST",
                "url": "/v1/jobs",
                "body": {"kind": "sleep", "input": {"steps": 1, "step_ms": 10}},
            }
        )
        + "\n"
        for i in range(lines)
    )
    files = {"file": ("m.jsonl", text.encode(), "application/jsonl")}
    before = int(r.info("memory")["used_memory"])
    source = (await http.post("/v1/files", files=files, data={"purpose": "batch"})).json()
    create = {"input_file_id": source["id"], "endpoint": "/v1/jobs", "completion_window": "24h"}
    batch = (await http.post("/v1/batches", json=create)).json()
    after = int(r.info("memory")["used_memory"])
    await http.post(f"/v1/batches/{batch['id']}/cancel")
    return (after - before) / lines


def preempted_lines(r: redis.Redis, job_ids: list[str]) -> int:
    """How many of the lines' jobs were stopped for interactive work at least once."""
    pipe = r.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.xrange(keys.job_events(job_id))
    return sum(
        any(
            e["type"] == "status" and json.loads(e["data"]).get("reason") == "preempted"
            for _, e in events
        )
        for events in pipe.execute()
    )


def busy_share(windows: list[tuple[float, float]], start: float, end: float, slots: int) -> float:
    """Share of `slots` x (end - start) that runs covered."""
    covered = sum(max(0.0, min(e, end) - max(s, start)) for s, e in windows)
    return covered / (slots * (end - start)) if end > start else 0.0


async def measure(
    args: argparse.Namespace, base_url: str, key: str, r: redis.Redis
) -> dict[str, Any]:
    capacity = args.slots / (args.service_ms / 1000)
    rate = args.load * capacity
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=512)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=120, limits=limits, trust_env=False
    ) as http:
        per_line = await memory_of_waiting_lines(http, r, args.memory_lines)
        console.print(f"Redis memory: {per_line:.0f} bytes per waiting line")
        console.print(f"interactive alone: {rate:.1f} jobs/s for {args.seconds} s")
        stop_at = time.monotonic() + args.seconds
        body = job_body(args.service_ms, args.step_ms)
        alone = await interactive_load(http, rate, body, lambda: time.monotonic() > stop_at, 1)
        console.print(f"interactive with a batch of {args.lines} lines")
        done = asyncio.Event()
        line_input = job_input(args.service_ms, args.step_ms)
        batch_task = asyncio.create_task(run_batch(http, args.lines, line_input))
        batch_task.add_done_callback(lambda _: done.set())
        started = time.time()
        both = await interactive_load(http, rate, body, done.is_set, 2)
        batch, batch_windows = await batch_task
    line_ids = batch.pop("job_ids", [])
    per_ended = memory_of_ended_line(r, line_ids)
    preempted = preempted_lines(r, line_ids)
    ideal_s = args.lines * args.service_ms / 1000 / (args.slots * (1 - args.load))
    first = min((s for s, _ in batch_windows), default=started)
    last = max((e for _, e in batch_windows), default=started)
    busy = busy_share(batch_windows + both.windows, first, last, args.slots)
    duration_s = last - started

    def row(name: str, r: Interactive) -> dict[str, Any]:
        return {
            "run": name,
            "jobs": len(r.latencies_s),
            "failures": r.failures,
            "p50_ms": percentile_ms(r.latencies_s, 50),
            "p99_ms": percentile_ms(r.latencies_s, 99),
            "queue_p50_ms": percentile_ms(r.queue_waits_s, 50),
            "queue_p99_ms": percentile_ms(r.queue_waits_s, 99),
        }

    rows = [row("interactive alone", alone), row("interactive + batch", both)]
    return {
        "rows": rows,
        "ratios": {
            "p50 with / without": rows[1]["p50_ms"] / rows[0]["p50_ms"],
            "p99 with / without": rows[1]["p99_ms"] / rows[0]["p99_ms"],
            "busy share while the batch had work": busy,
            "batch duration / idle-capacity time": duration_s / ideal_s,
        },
        "redis_bytes_per_waiting_line": per_line,
        "redis_bytes_per_ended_line_job": per_ended,
        "batch": {
            "lines": args.lines,
            "status": batch["status"],
            "request_counts": batch["request_counts"],
            "duration_s": duration_s,
            "ideal_s": ideal_s,
            "lines_preempted": preempted,
        },
        "setup": {
            "slots": args.slots,
            "service_ms": args.service_ms,
            "capacity_jobs_per_s": capacity,
            "interactive_jobs_per_s": rate,
            "step_ms": args.step_ms,
            "reserve_slots": args.reserve,
            "preempt": args.preempt,
        },
    }


def print_report(result: dict[str, Any]) -> None:
    table = Table(title="Interactive latency, alone and with a batch (one run)")
    for column in ("run", "jobs", "failures", "p50_ms", "p99_ms", "queue_p50_ms", "queue_p99_ms"):
        table.add_column(column, justify="right")
    for row in result["rows"]:
        table.add_row(*(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)
    for name, value in result["ratios"].items():
        console.print(f"{name}: {value:.3f}")
    console.print(f"batch: {result['batch']}")
    console.print(f"Redis bytes per waiting line: {result['redis_bytes_per_waiting_line']:.0f}")
    ended = result["redis_bytes_per_ended_line_job"]
    console.print(f"Redis bytes an ended line's job keeps (record, events): {ended:.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.batches", description=__doc__)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--service-ms", type=int, default=100)
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--step-ms", type=int, default=50)
    parser.add_argument("--reserve", type=int, default=0, help="batches.reserve_slots")
    parser.add_argument("--preempt", action="store_true", help="batches.preempt")
    parser.add_argument("--memory-lines", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/batches.json"))
    args = parser.parse_args(argv)
    env = {
        "MMQ_BATCHES__RESERVE_SLOTS": str(args.reserve),
        "MMQ_BATCHES__PREEMPT": str(args.preempt).lower(),
    }
    with sleep_deployment(args.slots, env) as (base_url, client):
        key = create_key(client, "bench")
        result = asyncio.run(measure(args, base_url, key, client))
    result["meta"] = run_meta()
    print_report(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
