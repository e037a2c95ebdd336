"""One candidate through the load levels: the same jobs at the same offsets each time,
through the tune's API like any client; what each request saw, per level; and what the
workers used meanwhile (CPU, memory, GPU).

A level stops early once it clearly breaks an SLO (more requests over an SLO's limit
than its percentile allows of the level's count), and the heavier levels are skipped:
they would break it too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

import httpx
import psutil
from pydantic import JsonValue

from common.stats import percentile
from host.devices import read_usage
from jobs.outputs import LlmOutput
from jobs.wire import Job, JobRequest
from tuning.load import closed_loop, open_loop
from tuning.slo import Sample, Slo, meets_all
from tuning.workload import Level, schedule

TERMINAL = frozenset({"succeeded", "failed", "canceled", "expired"})
FIRST_OUTPUT_METRICS = ("ttft", "first_audio", "first_segment", "first_step")
REPORTED = ("e2e", "queue_wait", *FIRST_OUTPUT_METRICS, "tpot")
WAIT_S = 60


@dataclass
class LevelResult:
    level: str
    load: float
    sent: int
    succeeded: int
    duration_s: float
    throughput: float
    """Succeeded requests per second."""
    goodput: float
    """Requests per second that met every SLO."""
    percentiles: dict[str, dict[str, float]]
    """Metric -> {"p50", "p95", "p99"} in ms, for the metrics the requests had."""
    sustained: bool
    """Every SLO held over the level's requests (a failed request misses every SLO)."""
    observed: dict[str, float] = field(default_factory=dict)
    """Each SLO (as text) -> the percentile it names, in ms, over the level's requests."""
    stopped_early: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    good_tokens_per_s: float = 0.0
    """Output tokens per second of the requests that met every SLO (LLM)."""


@dataclass
class Usage:
    cpu_pct: float | None = None
    """CPU of the candidate's processes (and their children), % of one core, over its levels."""
    rss_mib: float | None = None
    """Their resident memory at the end, summed."""
    gpu_util_pct: float | None = None
    gpu_mem_mib: float | None = None
    """Mean utilisation and peak memory of the pipeline's GPU (where it has one)."""


@dataclass
class Measurement:
    knobs: dict[str, float]
    repeat: int
    start_s: float | None = None
    """Worker start (model load included): reported, not counted."""
    levels: list[LevelResult] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    failed: str | None = None

    @property
    def goodput(self) -> float:
        """Goodput at the heaviest level it sustained (0 when it sustained none)."""
        kept = [lv.goodput for lv in self.levels if lv.sustained]
        return max(kept) if kept else 0.0

    @property
    def best_level(self) -> LevelResult | None:
        kept = [lv for lv in self.levels if lv.sustained]
        return max(kept, key=lambda lv: lv.goodput) if kept else None

    def to_json(self) -> dict[str, JsonValue]:
        return {**asdict(self), "goodput": self.goodput}


def sample_of(job: Job, e2e_ms: float) -> Sample:
    timings = job.get("timings") or {}
    first = timings.get("time_to_first_output_ms")
    metrics: dict[str, float | None] = {
        "e2e": e2e_ms,
        "queue_wait": timings.get("queue_wait_ms"),
        "tpot": timings.get("tpot_ms"),
        **dict.fromkeys(FIRST_OUTPUT_METRICS, first),
    }
    if job.get("status") != "succeeded":
        error = job.get("error")
        why = error.get("type", "?") if error else "?"
        return Sample(False, metrics, f"{job.get('status')}: {why}")
    output = cast(LlmOutput, job.get("output") or {})  # an LLM's output counts its tokens
    usage = output.get("usage") or {}
    return Sample(True, metrics, tokens=int(usage.get("completion_tokens") or 0))


class _Tally:
    """The samples of a level so far, and whether it has clearly broken an SLO."""

    def __init__(self, slos: Sequence[Slo], planned: int) -> None:
        self.slos = slos
        self.samples: list[Sample] = []
        self.misses: Counter[Slo] = Counter()
        self.allowed = {slo: slo.allowed_misses(planned) for slo in slos}
        self.broken = asyncio.Event()

    def record(self, sample: Sample) -> None:
        self.samples.append(sample)
        for slo in self.slos:
            if not slo.met(sample):
                self.misses[slo] += 1
                if self.misses[slo] > self.allowed[slo]:
                    self.broken.set()


async def run_level(
    base_url: str,
    kind: str,
    inputs: Sequence[dict[str, JsonValue]],
    level: Level,
    slos: Sequence[Slo],
    seed: int,
    request_timeout_s: float,
) -> LevelResult:
    order, offsets = schedule(level, len(inputs), seed)
    tally = _Tally(slos, level.requests)
    limits = httpx.Limits(max_connections=max(level.concurrency or 0, 64))
    timeout = httpx.Timeout(WAIT_S + 30.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:

        async def one(index: int) -> None:
            body: JobRequest = {"kind": kind, "input": inputs[order[index]]}
            tally.record(await _request(client, body, request_timeout_s))

        if level.concurrency:
            _, wall_s = await closed_loop(one, level.requests, level.concurrency, tally.broken)
        else:
            _, wall_s = await open_loop(one, offsets, tally.broken)
    return summarize(level, tally.samples, slos, max(wall_s, 1e-9), tally.broken.is_set())


def summarize(
    level: Level, samples: Sequence[Sample], slos: Sequence[Slo], duration_s: float, early: bool
) -> LevelResult:
    succeeded = [s for s in samples if s.ok]
    good = [s for s in succeeded if meets_all(slos, s)]
    table: dict[str, dict[str, float]] = {}
    for metric in REPORTED:
        values = [v for s in succeeded if (v := s.metrics.get(metric)) is not None]
        if values and (metric == "e2e" or metric in {slo.metric for slo in slos}):
            table[metric] = {f"p{p}": percentile(values, p) for p in (50, 95, 99)}
    observed = {str(slo): slo.observed(samples) for slo in slos}
    sustained = (
        not early and bool(samples) and all(observed[str(slo)] <= slo.limit_ms for slo in slos)
    )
    errors = Counter(s.error for s in samples if s.error)
    return LevelResult(
        level=str(level),
        load=level.load,
        sent=len(samples),
        succeeded=len(succeeded),
        duration_s=duration_s,
        throughput=len(succeeded) / duration_s,
        goodput=len(good) / duration_s,
        percentiles=table,
        sustained=sustained,
        observed=observed,
        stopped_early=early,
        errors=dict(errors),
        good_tokens_per_s=sum(s.tokens for s in good) / duration_s,
    )


async def _request(client: httpx.AsyncClient, body: JobRequest, timeout_s: float) -> Sample:
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            answer = await client.post("/v1/jobs", json=body, headers={"Prefer": f"wait={WAIT_S}"})
            if answer.status_code not in (200, 202):
                return Sample(False, {}, f"HTTP {answer.status_code}")
            job: Job = answer.json()
            while job.get("status") not in TERMINAL:
                answer = await client.get(
                    f"/v1/jobs/{job['id']}", headers={"Prefer": f"wait={WAIT_S}"}
                )
                job = answer.json()
    except TimeoutError:
        return Sample(False, {}, f"no end within {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return Sample(False, {}, f"{type(exc).__name__}")
    return sample_of(job, (time.monotonic() - started) * 1000)


class UsageProbe:
    """Samples the candidate's processes (and the GPU) once a second while it runs."""

    def __init__(self, pids: Sequence[int], device: str, period_s: float = 1.0) -> None:
        self.procs = [p for pid in pids if (p := _process(pid)) is not None]
        self.device = device
        self.period_s = period_s
        self._stop = threading.Event()
        self._gpu_util: list[float] = []
        self._gpu_mem: list[int] = []
        self._thread = threading.Thread(target=self._run, name="usage-probe", daemon=True)
        self._cpu0 = 0.0
        self._t0 = 0.0

    def __enter__(self) -> UsageProbe:
        self._cpu0, self._t0 = self._cpu_s(), time.monotonic()
        if self.device.startswith(("gpu:", "mig:")):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        self.elapsed_s = time.monotonic() - self._t0
        self.cpu_s = self._cpu_s() - self._cpu0

    def usage(self) -> Usage:
        rss = sum(_rss(p) for p in self.procs) / 2**20 if self.procs else None
        return Usage(
            cpu_pct=100 * self.cpu_s / self.elapsed_s if self.elapsed_s > 0 else None,
            rss_mib=rss,
            gpu_util_pct=100 * sum(self._gpu_util) / len(self._gpu_util)
            if self._gpu_util
            else None,
            gpu_mem_mib=max(self._gpu_mem) / 2**20 if self._gpu_mem else None,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            reading = read_usage(self.device)
            if reading is None:
                continue
            if reading.utilization is not None:
                self._gpu_util.append(reading.utilization)
            self._gpu_mem.append(reading.memory_used_bytes)

    def _cpu_s(self) -> float:
        total = 0.0
        for proc in self.procs:
            for member in _tree(proc):
                try:
                    times = member.cpu_times()
                    total += times.user + times.system
                except psutil.Error:
                    continue
        return total


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _rss(proc: psutil.Process) -> int:
    total = 0
    for member in _tree(proc):
        try:
            total += member.memory_info().rss
        except psutil.Error:
            continue
    return total
