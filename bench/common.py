"""Shared pieces of the benchmarks: per-request results, per-level summaries, the driver.

The driver runs N requests over `concurrency` lanes: each lane sends its next request as
soon as its previous one has come back (a closed loop), so `concurrency` requests are in
flight at any time until the last ones.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common.sse import aparse_lines
from common.stats import percentile
from host.launcher import Supervisor
from jobs.states import ends_job

Call = Callable[[], Awaitable[str | None]]
"""One request: returns None on success or a short error description."""

MAX_ERRORS_KEPT = 5


@dataclass
class RequestResult:
    """One request: whether it succeeded and how long it took, send to completion."""

    ok: bool
    latency_s: float
    error: str = ""


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


async def timed(call: Call) -> RequestResult:
    """Run `call`, timing it; an exception becomes a failed result, never a raise."""
    start = time.perf_counter()
    try:
        error = await call()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    return RequestResult(ok=error is None, latency_s=time.perf_counter() - start, error=error or "")


async def run_level(
    call: Call, requests: int, concurrency: int
) -> tuple[list[RequestResult], float]:
    """`requests` calls over `concurrency` closed-loop lanes; returns results and wall time."""
    todo = iter(range(requests))
    results: list[RequestResult] = []

    async def lane() -> None:
        for _ in todo:
            results.append(await timed(call))

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(max(1, min(concurrency, requests)))))
    return results, time.perf_counter() - start


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


@dataclass
class Trace:
    """One job as a client saw it, from submit."""

    first_s: float | None = None
    """The first `partial` event (ASR segment, TTS audio, LLM text)."""
    total_s: float = 0.0
    output: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


async def run_job(
    client: httpx.AsyncClient, kind: str, inp: dict[str, Any], timeout_s: float = 900.0
) -> Trace:
    """Submit a job and follow its events over SSE until it ends (or `timeout_s`)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _follow(client, kind, inp)
    except TimeoutError:
        return Trace(error=f"no end within {timeout_s:g}s")


async def _follow(client: httpx.AsyncClient, kind: str, inp: dict[str, Any]) -> Trace:
    trace = Trace()
    start = time.perf_counter()
    try:
        r = await client.post("/v1/jobs", json={"kind": kind, "input": inp})
        if r.status_code != 202:
            return Trace(error=f"submit {r.status_code}: {r.text[:200]}")
        job_id = r.json()["id"]
        async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            async for message in aparse_lines(response.aiter_lines()):
                event = json.loads(message.data)
                etype, data = event["type"], event["data"]
                if etype == "partial" and trace.first_s is None:
                    trace.first_s = time.perf_counter() - start
                elif etype == "output":
                    trace.output = data
                elif ends_job(etype, data):
                    if data["status"] != "succeeded":
                        trace.error = f"{data['status']}: {data.get('error')}"[:300]
                    break
        trace.total_s = time.perf_counter() - start
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        trace.timings = job.get("timings") or {}
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"[:300]
    return trace


REPO = Path(__file__).resolve().parents[1]


def child_env(
    config: Path, redis_url: str, data_dir: Path, log_level: str = "WARNING"
) -> dict[str, str]:
    """The environment of the mmq processes a bench starts: this checkout importable, no
    hub, its config, Redis and data dir, the API on loopback without keys."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "HF_HUB_OFFLINE": "1",
        "MMQ_CONFIG_FILE": str(config),
        "MMQ_REDIS_URL": redis_url,
        "MMQ_DATA_DIR": str(data_dir),
        "MMQ_LOG_LEVEL": log_level.upper(),
        "MMQ_API__HOST": "127.0.0.1",
        "MMQ_AUTH__REQUIRED": "false",
    }


def run_meta(**extra: Any) -> dict[str, Any]:
    """What a bench's JSON says of its run: when, how it was called, the machine."""
    return {
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        **extra,
    }


def check_alive(supervisor: Supervisor) -> None:
    """Raise if a process the bench started has exited."""
    for child in supervisor.children:
        if child.process is not None and child.process.poll() is not None:
            raise RuntimeError(f"{child.spec.name} exited with {child.process.returncode}")


def wait_healthy(api_url: str, supervisor: Supervisor, timeout_s: float = 60.0) -> None:
    """Poll GET /healthz until 200 (/readyz would wait for workers a bench starts later)."""
    wait_answers(api_url, "/healthz", supervisor, timeout_s)


def wait_api_ready(api_url: str, supervisor: Supervisor, timeout_s: float = 60.0) -> None:
    """Poll GET /readyz until 200 (Redis up and a live worker of each kind)."""
    wait_answers(api_url, "/readyz", supervisor, timeout_s)


def wait_answers(api_url: str, path: str, supervisor: Supervisor, timeout_s: float) -> None:
    """Poll GET `path` until 200, failing at once if a started process exited."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with httpx.Client(base_url=api_url, timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            check_alive(supervisor)
            try:
                response = client.get(path)
                if response.status_code == 200:
                    return
                last = f"{response.status_code} {response.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
    raise RuntimeError(f"{api_url}{path} not ready after {timeout_s:g}s: {last}")
