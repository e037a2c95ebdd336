"""What the sections of `bench.gpu` share: the plan, the run's context, result tables."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx

from bench.common import percentile_ms
from bench.gpu_deploy import Deployment, Workers
from bench.gpu_nvml import NvmlProbe, Sampler, Usage


@dataclass(frozen=True)
class Plan:
    """What one run measures, from `--device` (which models) and `--quick` (how much)."""

    device: str
    """`cuda` or `cpu`."""
    quick: bool
    asr_long: bool
    """The 60 s clip (else the 9 s one)."""
    asr_requests: int
    asr_concurrency: int
    asr_max_batch: int
    image_size: int
    image_steps: int
    image_requests: int
    tts_instances: tuple[int, ...]
    tts_jobs: int
    tts_concurrency: int
    llm_requests: int
    llm_concurrency: int
    llm_max_tokens: int
    llm_prompt_words: int
    asr_audio: str = ""
    """An mp3 file of the ASR clip, made ahead (`--asr-audio`): a GPU host without Piper,
    the voice the clip is spoken with, reads it instead."""

    @property
    def worker_device(self) -> str:
        return "gpu:0" if self.device == "cuda" else "cpu"


def make_plan(device: str, quick: bool, asr_audio: str = "") -> Plan:
    """The CPU runs tiny models; `quick` sends fewer requests (CI, or a short GPU check)."""
    gpu = device == "cuda"
    return Plan(
        device=device,
        quick=quick,
        asr_long=gpu,
        asr_requests=2 if quick else 32,
        asr_concurrency=2 if quick else 16,
        asr_max_batch=2 if quick else 16,
        image_size=512 if gpu else 64,
        image_steps=(10 if quick else 25) if gpu else 4,
        image_requests=4 if quick else 8,
        tts_instances=(1, 2) if quick else (1, 2, 4),
        tts_jobs=2 if quick else 32,
        tts_concurrency=2 if quick else 8,
        llm_requests=4 if quick else 64,
        llm_concurrency=4 if quick else 32,
        llm_max_tokens=16 if quick else 128,
        llm_prompt_words=20 if quick else 100,
        asr_audio=asr_audio,
    )


def override(plan: Plan, settings: Sequence[str]) -> Plan:
    """`plan` with `KEY=VALUE` settings (`--set`) applied: an int, a bool (true/false) or
    a comma-separated tuple of ints, as the field already holds; an unknown key or a value
    of the wrong type raises ValueError naming it."""
    changes: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or key not in plan.__dataclass_fields__ or key in {"device"}:
            raise ValueError(f"--set {setting}: expected KEY=VALUE with KEY a field of Plan")
        current = getattr(plan, key)
        try:
            if isinstance(current, bool):
                if value not in {"true", "false"}:
                    raise ValueError(value)
                changes[key] = value == "true"
            elif isinstance(current, int):
                changes[key] = int(value)
            elif isinstance(current, tuple):
                changes[key] = tuple(int(v) for v in value.split(","))
            else:
                changes[key] = value
        except ValueError:
            raise ValueError(f"--set {setting}: {key} takes a {type(current).__name__}") from None
    return replace(plan, **changes)


@dataclass
class Table:
    """Rows of one measurement: `columns` name the keys of each row shown in the report;
    rows may hold more (they all go to the JSON)."""

    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SectionResult:
    name: str
    tables: list[Table] = field(default_factory=list)
    ratios: dict[str, float | None] = field(default_factory=dict)
    """None where a side did not measure (nothing completed)."""
    notes: list[str] = field(default_factory=list)
    loads: list[dict[str, Any]] = field(default_factory=list)
    """One row per model: how long it took to load and warm, and its memory."""
    skipped: str = ""
    """Why it did not run (GPU only, failed); empty when it ran."""


@dataclass
class Context:
    """One run: the deployment, the sampler, the plan and the models."""

    plan: Plan
    deployment: Deployment
    sampler: Sampler
    models: Any
    """`bench.gpu_models.Models`."""
    prestarted: dict[str, Workers] = field(default_factory=dict)
    """Worker groups started ahead (`--quick`: all at once, to save time), by key."""
    failed_starts: dict[str, str] = field(default_factory=dict)
    """Groups started ahead that failed to load, by key: why (their sections fail alone)."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """`Deployment.check` of each group once loaded: devices, pinning, GPU metrics."""

    def workers(self, instances: dict[str, int], first: int = 0) -> Workers:
        """The loaded workers of `instances`, numbered from `first` (started here unless
        started ahead)."""
        key = group_key(instances, first)
        if key in self.failed_starts:
            raise RuntimeError(self.failed_starts[key])
        group = self.prestarted.pop(key, None)
        if group is None:
            group = self.deployment.start(instances, first)
        with self.sampler.phase("loading"):
            self.deployment.wait_loaded(group)
        try:
            self.checks.append({"group": key} | self.deployment.check(group))
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            self.checks.append({"group": key, "error": repr(exc)})
        return group

    def stop(self, group: Workers) -> None:
        """Stop a section's workers once it is done: on a GPU, so that the next section
        has the device to itself; idle CPU workers cost nothing and stop at the end."""
        if self.plan.device == "cuda":
            with self.sampler.phase("stopping"):
                self.deployment.stop(group)

    def shrink(self, group: Workers, pipeline: str, keep: int) -> None:
        with self.sampler.phase("stopping"):
            self.deployment.shrink(group, pipeline, keep)

    def worker_loads(self, group: Workers, label: dict[str, str]) -> list[dict[str, Any]]:
        """A load row per pipeline of `group`: load-and-warm seconds, GPU memory."""
        per_pid = self.process_mib()
        rows = []
        for name, times in group.loaded_s.items():
            pids = group.pids_of(name)
            mib = sum(per_pid.get(pid, 0.0) for pid in pids) if per_pid else None
            rows.append(
                {
                    "model": label.get(name, name),
                    "where": f"mmq worker {name}",
                    "instances": len(times),
                    "load_warm_s": max(times),
                    "gpu_mib": mib,
                }
            )
        return rows

    def process_mib(self) -> dict[int, float]:
        probe = self.sampler.probe
        return probe.process_mib() if isinstance(probe, NvmlProbe) else {}

    def usage(self, phase: str) -> dict[str, Any]:
        return usage_columns(self.sampler.usage(phase))


def group_key(instances: dict[str, int], first: int = 0) -> str:
    return ",".join(f"{k}[{first}:{first + v}]" for k, v in sorted(instances.items()))


def usage_columns(usage: Usage | None) -> dict[str, Any]:
    if usage is None:
        return {"busy_pct": None, "mem_mib": None}
    return {"busy_pct": usage.busy_mean_pct, "mem_mib": usage.mem_max_mib}


def latency_columns(prefix: str, seconds: Sequence[float]) -> dict[str, Any]:
    """`{prefix}_p50_s`, `{prefix}_p99_s` of `seconds` (None when empty)."""
    values = list(seconds)
    if not values:
        return {f"{prefix}_p50_s": None, f"{prefix}_p99_s": None}
    return {
        f"{prefix}_p50_s": percentile_ms(values, 50) / 1000,
        f"{prefix}_p99_s": percentile_ms(values, 99) / 1000,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


class Section(Protocol):
    name: str

    def pipelines(self, ctx_plan: Plan, models: Any) -> dict[str, dict[str, Any]]:
        """The config tables of the pipelines it measures through mmq."""
        ...

    def groups(self, plan: Plan) -> list[tuple[dict[str, int], int]]:
        """Its worker groups (pipeline -> instances, first instance), in the order it
        starts them; a later group may join an earlier one's pipeline."""
        ...

    def run(self, ctx: Context) -> SectionResult: ...


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.start
