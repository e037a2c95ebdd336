"""`bench.llm_ceiling`'s tables: each load's targets (direct, router, mmq) side by side,
mmq's CPU by process, the fit, and the goals (issue 55) met or missed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

console = Console(width=160)
TARGETS = ("direct", "router", "mmq")


@dataclass
class Level:
    load: str
    target: str
    requests: int
    failures: int
    wall_s: float
    tokens_per_s: float
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds each of the target's processes spent over the level (mmq's processes,
    or the router's; none for direct)."""
    tokens: int = 0
    errors: list[str] = field(default_factory=list)


def by_role(cpu_s: dict[str, float]) -> dict[str, float]:
    """CPU seconds by role: the LLM workers summed (one per engine step in use)."""
    out: dict[str, float] = {}
    for name, seconds in cpu_s.items():
        role = "worker" if name.startswith("worker") else name
        out[role] = out.get(role, 0.0) + seconds
    return out


def report(levels: list[Level], fitted: dict[str, float], goals: dict[str, float]) -> list[Verdict]:
    """Print the tables; the goals' verdicts."""
    table = Table(title="LLM token path: direct, vllm-router and mmq on one engine (one run)")
    for col in ("load", "target", "tokens/s", "x direct", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT p50 ms", "req/s", "CPU µs/token", "failures"):  # fmt: skip
        table.add_column(col, justify="right")
    by = {(lv.load, lv.target): lv for lv in levels}
    loads = list(dict.fromkeys(lv.load for lv in levels))
    for i, load in enumerate(loads):
        d = by.get((load, "direct"))
        rows = [by[(load, t)] for t in TARGETS if (load, t) in by]
        for j, lv in enumerate(rows):
            cpu = sum(lv.cpu_s.values())
            table.add_row(
                load if j == 0 else "",
                lv.target,
                f"{lv.tokens_per_s:,.0f}",
                f"{lv.tokens_per_s / d.tokens_per_s:.2f}x" if d and d.tokens_per_s else "-",
                f"{lv.ttft_p50_ms:.1f}",
                f"{lv.ttft_p99_ms:.1f}",
                f"{lv.tpot_p50_ms:.2f}",
                f"{lv.requests_per_s:.0f}",
                f"{cpu / lv.tokens * 1e6:.1f}" if lv.cpu_s and lv.tokens else "-",
                str(lv.failures),
                end_section=j == len(rows) - 1 and i < len(loads) - 1,
            )
    console.print(table)
    console.print(
        "CPU µs/token: all of the target's processes over the level, requests included "
        "(mmq: API, workers, Redis, reaper, scheduler; router: its one process)"
    )
    mmq_levels = [lv for lv in levels if lv.target == "mmq" and lv.tokens]
    split = Table(title="mmq CPU by process, per level (µs per token)")
    names = list(by_role(mmq_levels[0].cpu_s)) if mmq_levels else []
    split.add_column("load")
    for name in names:
        split.add_column(name, justify="right")
    for lv in mmq_levels:
        roles = by_role(lv.cpu_s)
        split.add_row(lv.load, *(f"{roles[n] / lv.tokens * 1e6:.1f}" for n in names))
    console.print(split)
    if not fitted:
        console.print("no fit: it needs mmq levels of two different tokens per request")
    else:
        fit_table = Table(title="mmq's CPU fitted over the loads (a x tokens + b x requests)")
        fit_table.add_column("")
        for name in ["all of mmq", *names]:
            fit_table.add_column(name, justify="right")
        keys = ["total", *names]
        fit_table.add_row("µs per token", *(f"{fitted[f'{n}_us_per_token']:.1f}" for n in keys))
        fit_table.add_row("ms per request", *(f"{fitted[f'{n}_ms_per_request']:.2f}" for n in keys))
        console.print(fit_table)
    verdicts = judge(levels, fitted, goals)
    goals_table(verdicts)
    return verdicts


@dataclass
class Verdict:
    goal: str
    measured: str
    met: bool | None
    """None: not measured in this run (its load was not run, or too few levels to fit)."""


def judge(levels: list[Level], fitted: dict[str, float], goals: dict[str, float]) -> list[Verdict]:
    """Issue 64's goals against this run: mmq's fitted CPU, its tokens/s against direct
    at 64x8@20 and 256x128@20, TTFT p50 at 16 streams, and at 256x128 TTFT p50 over
    direct against the burst's CPU bound (fitted CPU per request x streams / cores)."""
    by = {(lv.load, lv.target): lv for lv in levels}
    out = []
    us, ms = fitted.get("total_us_per_token"), fitted.get("total_ms_per_request")
    out.append(
        Verdict(
            f"mmq CPU per request <= {goals['cpu_per_request_ms_max']:g} ms (fitted)",
            f"{ms:.2f} ms" if ms is not None else "-",
            None if ms is None else ms <= goals["cpu_per_request_ms_max"],
        )
    )
    out.append(
        Verdict(
            f"mmq CPU per token <= {goals['cpu_per_token_us_max']:g} µs (fitted)",
            f"{us:.1f} µs" if us is not None else "-",
            None if us is None else us <= goals["cpu_per_token_us_max"],
        )
    )

    redis_us = fitted.get("redis_us_per_token")
    limit_us = goals["redis_cpu_per_token_us_max"]
    out.append(
        Verdict(
            f"Redis CPU per token <= {limit_us:g} µs (fitted)",
            f"{redis_us:.1f} µs" if redis_us is not None else "-",
            None if redis_us is None else redis_us <= limit_us,
        )
    )

    def pair(load: str) -> tuple[Level, Level] | None:
        d, m = by.get((load, "direct")), by.get((load, "mmq"))
        return (d, m) if d and m else None

    for load, key in (("64x8@20", "tokens_ratio_min_64x8"),
                      ("256x128@20", "tokens_ratio_min_256x128")):  # fmt: skip
        goal = f"{load}: mmq tokens/s >= {goals[key]:g}x direct"
        p = pair(load)
        if p is None or not p[0].tokens_per_s:
            out.append(Verdict(goal, "not run", None))
            continue
        ratio = p[1].tokens_per_s / p[0].tokens_per_s
        out.append(Verdict(goal, f"{ratio:.2f}x", ratio >= goals[key]))
    sixteen = [lv.load for lv in levels if lv.target == "mmq" and lv.load.startswith("16x")]
    limit = goals["ttft_p50_extra_ms_max_16"]
    for load in sixteen or ["16 streams"]:
        goal = f"{load}: mmq TTFT p50 <= direct + {limit:g} ms"
        p = pair(load)
        if p is None:
            out.append(Verdict(goal, "not run", None))
            continue
        extra = p[1].ttft_p50_ms - p[0].ttft_p50_ms
        out.append(Verdict(goal, f"+{extra:.1f} ms", extra <= limit))
    load, streams, cores = "256x128@20", 256, os.cpu_count() or 1
    goal = f"{load}: mmq TTFT p50 - direct <= burst CPU bound"
    p = pair(load)
    if p is None or ms is None:
        out.append(Verdict(goal, "not run" if p is None else "no fit", None))
    else:
        bound = ms * streams / cores * goals["ttft_p50_extra_vs_burst_bound_max"]
        extra = p[1].ttft_p50_ms - p[0].ttft_p50_ms
        measured = f"+{extra:.0f} ms vs {bound:.0f} ms ({ms:.2f} ms x {streams} / {cores} cores)"
        out.append(Verdict(goal, measured, extra <= bound))
    return out


def goals_table(verdicts: list[Verdict]) -> None:
    table = Table(title="goals (issue 64)")
    table.add_column("goal")
    table.add_column("measured", justify="right")
    table.add_column("result")
    for v in verdicts:
        table.add_row(v.goal, v.measured, {True: "met", False: "missed", None: "-"}[v.met])
    console.print(table)
