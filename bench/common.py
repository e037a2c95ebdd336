"""Shared pieces of the benchmarks: per-level summaries over the harness's driver
(`tuning.load`, whose names the benches import from here too), and their processes.
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from common.stats import percentile
from tuning.load import Call, RequestResult, closed_loop, timed

MAX_ERRORS_KEPT = 5


@dataclass
class LevelSummary:
    """One target at one concurrency level."""

    target: str
    concurrency: int
    requests: int
    completed: int
    failures: int
    duration_s: float
    throughput: float
    """Completed requests per second over the whole level."""
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int] = field(default_factory=dict)
    """The most frequent error descriptions and their counts."""


async def run_level(
    call: Call, requests: int, concurrency: int
) -> tuple[list[RequestResult], float]:
    """`requests` timed calls over `concurrency` closed-loop lanes; results and wall time."""
    return await closed_loop(lambda _: timed(call), requests, concurrency)


def percentile_ms(latencies: list[float], pct: float) -> float:
    """The `pct`-th percentile of `latencies` (seconds) in milliseconds, nearest rank as
    `mmq tune` reads SLOs (`common.stats`); NaN when empty."""
    return percentile(latencies, pct) * 1000


def summarize(
    target: str, concurrency: int, results: list[RequestResult], duration_s: float
) -> LevelSummary:
    ok = [r.latency_s for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    return LevelSummary(
        target=target,
        concurrency=concurrency,
        requests=len(results),
        completed=len(ok),
        failures=len(results) - len(ok),
        duration_s=duration_s,
        throughput=len(ok) / duration_s if duration_s > 0 else 0.0,
        mean_ms=statistics.fmean(ok) * 1000 if ok else float("nan"),
        p50_ms=percentile_ms(ok, 50),
        p95_ms=percentile_ms(ok, 95),
        p99_ms=percentile_ms(ok, 99),
        errors=dict(errors.most_common(MAX_ERRORS_KEPT)),
    )


async def measure(target: str, call: Call, requests: int, concurrency: int) -> LevelSummary:
    results, duration_s = await run_level(call, requests, concurrency)
    return summarize(target, concurrency, results, duration_s)


REPO = Path(__file__).resolve().parents[1]


def own_cpu_s() -> float:
    """This process's CPU time so far (user and system), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_s(client: redis.Redis) -> float:
    """The Redis server's CPU time so far (`INFO cpu`), in seconds."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def write_runs(out: Path, meta: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """A bench's runs and `run_meta` as its JSON at `out`, said."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")
    print(f"wrote {out}")


def run_meta(**extra: Any) -> dict[str, Any]:
    """What a bench's JSON says of its run: when, how it was called, the machine."""
    return {
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        **extra,
    }
