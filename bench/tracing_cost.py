"""What traces cost: `bench.overhead` with `[tracing]` off and on, in turns, in one run.

    python -m bench.tracing_cost [--pairs 2] [--requests 600]
                                 [--out bench/results/tracing-cost.json]

Each pair runs `python -m bench.overhead` (its own Redis, API and noop worker, no-op jobs
through `POST /v1/jobs` beside bare Celery) once with tracing off and once with it on,
exporting every span to a real OTLP endpoint in this process (`harness.otlp_receiver`), so
that a slow spell of a shared machine falls on both. It prints, per concurrency level, mmq's
p50 and jobs/s with tracing on over off (each also over the same run's Celery floor), and
the spans received per job, and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import run_meta
from harness.otlp_receiver import receiving_spans

console = Console()
DEFAULT_OUT = Path("bench/results/tracing-cost.json")


def overhead(
    out: Path, requests: int, env: dict[str, str], cwd: Path | None = None
) -> dict[tuple[str, int], Any]:
    """One run of `bench.overhead` (of the checkout at `cwd`, else this one); its results
    by (target, concurrency)."""
    argv = [sys.executable, "-m", "bench.overhead", "--requests", str(requests), "--out", str(out)]
    subprocess.run(argv, env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL, cwd=cwd)
    results = json.loads(out.read_text())["results"]
    return {(r["target"], r["concurrency"]): r for r in results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--against", metavar="DIR",
        help="a checkout of a commit before tracing (a git worktree): its bench.overhead "
        "runs in each pair too, so that tracing off is compared with no tracing code at all",
    )  # fmt: skip
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[Any, Any]]] = {"off": [], "on": [], "before": []}
    spans_per_job: list[float] = []
    with tempfile.TemporaryDirectory(prefix="mmq-tracing-cost-") as tmp, receiving_spans() as otlp:
        on = {"MMQ_TRACING__ENABLED": "true", "MMQ_TRACING__ENDPOINT": otlp.endpoint}
        modes: list[tuple[str, dict[str, str]]] = [
            ("off", {"MMQ_TRACING__ENABLED": "false"}), ("on", on)
        ]  # fmt: skip
        if args.against:
            modes.insert(0, ("before", {}))
        for pair in range(args.pairs):
            for mode, env in modes:
                before = len(otlp.spans())
                cwd = Path(args.against) if mode == "before" else None
                result = overhead(Path(tmp) / f"{mode}-{pair}.json", args.requests, env, cwd)
                runs[mode].append(result)
                if mode == "on":
                    jobs = sum(r["completed"] for k, r in result.items() if k[0] == "mmq")
                    spans_per_job.append((len(otlp.spans()) - before) / max(jobs, 1))
                console.print(f"pair {pair + 1}: tracing {mode} done")
    levels = sorted({c for target, c in runs["off"][0] if target == "mmq"})
    rows: list[dict[str, Any]] = []
    for level in levels:

        def median(mode: str, field: str, over_floor: bool, level: int = level) -> float:
            values = [
                run[("mmq", level)][field] / (run[("celery", level)][field] if over_floor else 1)
                for run in runs[mode]
            ]
            return float(statistics.median(values))

        rows.append(
            {
                "concurrency": level,
                "p50_ms_off": median("off", "p50_ms", False),
                "p50_ms_on": median("on", "p50_ms", False),
                "p50_on_over_off": median("on", "p50_ms", False) / median("off", "p50_ms", False),
                "p50_over_celery_on_over_off": median("on", "p50_ms", True)
                / median("off", "p50_ms", True),
                "jobs_s_off": median("off", "throughput", False),
                "jobs_s_on": median("on", "throughput", False),
                "jobs_s_on_over_off": median("on", "throughput", False)
                / median("off", "throughput", False),
            }
        )
        if runs["before"]:
            rows[-1] |= {
                "p50_off_over_before": median("off", "p50_ms", False)
                / median("before", "p50_ms", False),
                "jobs_s_off_over_before": median("off", "throughput", False)
                / median("before", "throughput", False),
            }
    table = Table(title=f"Tracing on over off: bench.overhead, {args.pairs} pairs, medians")
    for column in ("concurrency", "p50 off ms", "p50 on ms", "p50 on/off", "p50/celery on/off",
                   "jobs/s off", "jobs/s on", "jobs/s on/off"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            str(row["concurrency"]), f"{row['p50_ms_off']:.2f}", f"{row['p50_ms_on']:.2f}",
            f"{row['p50_on_over_off']:.2f}x", f"{row['p50_over_celery_on_over_off']:.2f}x",
            f"{row['jobs_s_off']:.0f}", f"{row['jobs_s_on']:.0f}",
            f"{row['jobs_s_on_over_off']:.2f}x",
        )  # fmt: skip
    console.print(table)
    for row in rows:
        if "p50_off_over_before" in row:
            console.print(
                f"concurrency {row['concurrency']}: tracing off over the commit before it: "
                f"p50 {row['p50_off_over_before']:.2f}x, "
                f"jobs/s {row['jobs_s_off_over_before']:.2f}x"
            )
    console.print(f"spans received per job with tracing on: {spans_per_job}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": run_meta(), "rows": rows, "spans_per_job": spans_per_job}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
