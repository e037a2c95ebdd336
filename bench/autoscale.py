"""Desired workers following a burst: a pipeline of known cost (`bench.sleepwork`'s
`work`, each job sleeping `--service-ms` on a worker of `--slots`) starts with no worker;
a burst of `--burst` jobs comes at once; the table shows, every `--interval-s`, what
`/metrics` says of the pipeline (jobs waiting, running, slots live, the oldest wait, the
measured service time, desired workers) and the workers started so far. With `--follow`
(the default) the bench acts as the autoscaler would: it starts workers up to what
`mmq_pipeline_desired_workers` asks for (at most `--max-workers`), and never stops any
(scaling down is the orchestrator's, after its cooldown).

At the end, with every process but the API stopped, it counts the Redis commands and
times one scrape of `/metrics` (`--scrapes` of them).

    python -m bench.autoscale --out bench/results/autoscale-2026-11-27.json
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from bench.common import run_meta
from bench.sleepwork import PIPELINE, job_body
from harness.scrape import parse, value
from jobstore.api_keys import create_key
from tuning.deployment import Deployment, private_deployment

console = Console(width=140)

SIGNALS = ("jobs_waiting", "jobs_running", "slots_live", "oldest_wait_seconds",
           "service_seconds", "desired_workers")  # fmt: skip


def read_signals(http: httpx.Client) -> dict[str, float]:
    samples = parse(http.get("/metrics").text)
    return {name: value(samples, f"mmq_pipeline_{name}", pipeline="work") for name in SIGNALS}


def burst(http: httpx.Client, n: int, service_ms: int) -> list[str]:
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda _: http.post("/v1/jobs", json=job_body(service_ms)), range(n))
        )
    return [a.json()["id"] for a in answers if a.status_code == 202]


def follow(
    dep: Deployment, http: httpx.Client, ids: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The table's rows, until every job ended and desired workers are back to 0."""
    started_at = time.monotonic()
    rows: list[dict[str, Any]] = []
    workers = 0
    pending = set(ids)
    while time.monotonic() - started_at < args.timeout_s:
        row = {"t_s": round(time.monotonic() - started_at, 2), **read_signals(http)}
        if args.follow and row["desired_workers"] > workers and workers < args.max_workers:
            for _ in range(min(int(row["desired_workers"]), args.max_workers) - workers):
                dep.start_worker("work", wait=False)
                workers += 1
        row["workers_started"] = workers
        rows.append(row)
        pending = {
            j
            for j in pending
            if http.get(f"/v1/jobs/{j}").json()["status"] in ("queued", "running")
        }
        if not pending and row["desired_workers"] == 0 and row["jobs_running"] == 0:
            break
        time.sleep(args.interval_s)
    return rows


def scrape_cost(
    dep: Deployment, http: httpx.Client, client: redis.Redis, n: int
) -> dict[str, float]:
    """Redis commands and wall time of one scrape, with nothing else running."""
    for proc in dep.procs:
        if proc.name != "api":
            proc.stop()
    http.get("/metrics")

    def calls() -> int:
        stats = client.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    before = calls()
    start = time.perf_counter()
    for _ in range(n):
        http.get("/metrics")
    wall_s = time.perf_counter() - start
    commands = calls() - before - 1  # less the INFO of `before`
    return {"redis_commands_per_scrape": commands / n, "ms_per_scrape": wall_s / n * 1000}


def table(rows: list[dict[str, Any]]) -> Table:
    out = Table(title="pipeline `work`: a burst, and what /metrics said of it")
    columns = ["t_s", "jobs_waiting", "jobs_running", "slots_live", "oldest_wait_seconds",
               "service_seconds", "desired_workers", "workers_started"]  # fmt: skip
    for column in columns:
        out.add_column(column.replace("_seconds", "_s"), justify="right")
    for row in rows:
        out.add_row(*(f"{row[c]:g}" if isinstance(row[c], float) else str(row[c]) for c in columns))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    env = {
        "MMQ_AUTOSCALE__TARGET_WAIT_S": str(args.target_wait_s),
        "MMQ_AUTOSCALE__READY_WITHOUT_WORKERS": "true",
        "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.05",
        "MMQ_QUEUE__MAX_QUEUED": "100000",
    }
    config = PIPELINE.format(slots=args.slots)
    # The tests' kinds (`sleep`) and pipelines beside `work`; none of them has a worker.
    with private_deployment(config, env, [], prefix="mmq-autoscale-") as dep:
        client = redis.Redis.from_url(dep.redis_url, decode_responses=True)
        key = create_key(client, "burst")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=dep.base_url, headers=headers, timeout=30) as http:
            dep.wait_ready()
            console.print(f"no worker; a burst of {args.burst} jobs of {args.service_ms} ms")
            ids = burst(http, args.burst, args.service_ms)
            if len(ids) < args.burst:
                raise SystemExit(f"only {len(ids)} of {args.burst} jobs were accepted")
            rows = follow(dep, http, ids, args)
            console.print(table(rows))
            cost = scrape_cost(dep, http, client, args.scrapes)
    console.print(
        f"one scrape: {cost['redis_commands_per_scrape']:.1f} Redis commands, "
        f"{cost['ms_per_scrape']:.1f} ms (mean of {args.scrapes}, nothing else running)"
    )
    return {"accepted": len(ids), "rows": rows, "scrape": cost}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__)
    parser.add_argument("--burst", type=int, default=60)
    parser.add_argument("--service-ms", type=int, default=500)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--target-wait-s", type=float, default=5.0)
    parser.add_argument("--max-workers", type=int, default=3)
    parser.add_argument("--no-follow", dest="follow", action="store_false")
    parser.add_argument("--interval-s", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/results/autoscale.json"))
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result |= {"meta": run_meta(), "setup": vars(args) | {"out": str(args.out)}}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
