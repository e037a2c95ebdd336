"""Fair share between keys, measured: key A submits a burst at once while key B submits
one job a second, with fair share off and on, in one run.

    python -m bench.fairness [--burst 500] [--slots 4] [--service-ms 100]
                             [--out bench/results/fairness.json]

The pipeline is the tests' `SleepPipeline` (each job sleeps `--service-ms`) with `--slots`
runners on one worker. For each setting (`fairness.enabled` false, then true) a fresh
deployment runs: A's burst alone (A's throughput), then A's burst again with B's one job
a second until A's burst is done. Reported: B's queue wait p50/p99 and A's jobs/s, alone
and beside B. Goals (issue 35): with fair share, B's p99 queue wait <= 2x one job's
service time, and A's throughput >= 0.95x alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from bench.sleepwork import job_body, sleep_deployment
from jobstore.api_keys import create_key

console = Console(width=140)


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
    from datetime import datetime

    created = min(datetime.fromisoformat(j["created_at"]).timestamp() for j in jobs)
    finished = max(datetime.fromisoformat(j["finished_at"]).timestamp() for j in jobs)
    return finished - created


async def _measure(
    base_url: str, a_key: str, b_key: str, args: argparse.Namespace
) -> dict[str, Any]:
    body = job_body(args.service_ms)
    limits = httpx.Limits(max_connections=1024)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=limits, trust_env=False
    ) as http:
        alone = await _ended(http, a_key, await _burst(http, a_key, args.burst, body))
        a_alone = len(alone) / _span_s(alone)
        ids = await _burst(http, a_key, args.burst, body)
        b_ids = []
        headers = {"Authorization": f"Bearer {b_key}"}

        async def a_done() -> list[dict[str, Any]]:
            return await _ended(http, a_key, ids)

        a_task = asyncio.create_task(a_done())
        while not a_task.done():
            r = await http.post("/v1/jobs", json=body, headers=headers)
            b_ids.append(r.json()["id"])
            await asyncio.sleep(1.0)
        beside = await a_task
        b_jobs = await _ended(http, b_key, b_ids)
    waits = [(j["timings"]["queue_wait_ms"] or 0) / 1000 for j in b_jobs]
    return {
        "a_jobs_per_s_alone": a_alone,
        "a_jobs_per_s_beside_b": len(beside) / _span_s(beside),
        "b_jobs": len(b_jobs),
        "b_queue_wait_p50_ms": percentile_ms(waits, 50),
        "b_queue_wait_p99_ms": percentile_ms(waits, 99),
    }


def run_setting(args: argparse.Namespace, fair: bool) -> dict[str, Any]:
    env = {"MMQ_FAIRNESS__ENABLED": "true" if fair else "false"}
    with sleep_deployment(args.slots, env) as (base_url, client):
        a_key, b_key = create_key(client, "team-a"), create_key(client, "team-b")
        console.print(
            f"fair share {'on' if fair else 'off'}: A's {args.burst} jobs, B one a second"
        )
        return {"fairness": fair} | asyncio.run(_measure(base_url, a_key, b_key, args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--service-ms", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fairness.json"))
    args = parser.parse_args(argv)
    rows = [run_setting(args, False), run_setting(args, True)]
    table = Table(title=f"Key A: {args.burst} jobs at once; key B: one a second (one run)")
    columns = ["fairness", "a_jobs_per_s_alone", "a_jobs_per_s_beside_b", "b_jobs",
               "b_queue_wait_p50_ms", "b_queue_wait_p99_ms"]  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            *(f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns)
        )
    console.print(table)
    fair = rows[1]
    ratios = {
        "B p99 queue wait / service time (fair share on)": fair["b_queue_wait_p99_ms"]
        / args.service_ms,
        "A jobs/s beside B / alone (fair share on)": fair["a_jobs_per_s_beside_b"]
        / fair["a_jobs_per_s_alone"],
    }
    for name, value in ratios.items():
        console.print(f"{name}: {value:.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "rows": rows,
        "ratios": ratios,
        "meta": run_meta(),
        "setup": vars(args) | {"out": str(args.out)},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
