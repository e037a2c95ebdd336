"""What a tune tells: a table of every candidate, the winner and its ratio to the current
config, a PNG of goodput and p99 against load, JSON of everything, and the config change
(written in place with its comments kept, or shown as a diff)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import tomlkit
from pydantic import JsonValue
from rich.console import Console
from rich.table import Table

from tuning.search import Outcome, Stats
from tuning.slo import Slo, parse_duration_ms
from tuning.space import Candidate, Value, key

TOP_PLOTTED = 4


class TuneMeta(TypedDict):
    """What was tuned, and how: `meta` of tune.json."""

    pipeline: str
    kind: str
    slos: list[str]
    levels: list[str]
    space: dict[str, list[Value]]
    repeats: int
    seed: int
    finished_at: str
    host: str
    cpu_count: int | None


class CandidateResult(TypedDict):
    knobs: Candidate
    goodput_median: float
    goodput_spread: list[float]
    failed: str | None
    runs: list[dict[str, JsonValue]]
    """Each run's `Measurement`, its fields as JSON."""


class TuneResult(TypedDict):
    """tune.json: every candidate, and the outcome."""

    meta: TuneMeta
    verdict: str
    budget_ran_out: bool
    elapsed_s: float
    current: Candidate
    winner: Candidate | None
    best: Candidate | None
    candidates: list[CandidateResult]


def table(outcome: Outcome, slos: Sequence[Slo]) -> Table:
    t = Table(title="mmq tune: every candidate (goodput = requests/s that met every SLO)")
    gpu = any(m.usage.gpu_util_pct is not None for s in outcome.stats for m in s.runs)
    tokens = _has_tokens(outcome)
    columns = ["knobs", "goodput/s (runs)", *(["good tok/s"] if tokens else [])]
    columns += ["at load", "e2e p50/p95/p99 ms"]
    columns += [*(str(s) for s in slos), "CPU %", "RSS MiB", *(["GPU %"] if gpu else [])]
    for column in [*columns, "start s", "met SLO"]:
        t.add_column(column, justify="left" if column == "knobs" else "right")
    for stats in outcome.stats:
        t.add_row(*row(stats, slos, outcome, gpu, tokens), style=_style(stats, outcome))
    return t


def _has_tokens(outcome: Outcome) -> bool:
    """Whether the requests had output tokens (an LLM): then the table shows them."""
    return any(lv.good_tokens_per_s > 0 for s in outcome.stats for m in s.runs for lv in m.levels)


def row(
    stats: Stats, slos: Sequence[Slo], outcome: Outcome, gpu: bool, tokens: bool = False
) -> list[str]:
    """A candidate's cells: its median goodput and each run's, then its best run's level
    (`good tok/s` there where `tokens`), percentiles, usage and start time."""
    name = key(stats.knobs) + (" (current)" if stats is outcome.base else "")
    blanks = len(slos) + 4 + int(gpu) + int(tokens)
    if stats.failed:
        return [name, "failed", stats.failed[:80], *["-"] * blanks]
    runs = stats.measured
    best = max(runs, key=lambda m: m.goodput)
    level = best.best_level or (best.levels[0] if best.levels else None)
    e2e = level.percentiles.get("e2e", {}) if level else {}
    usage = best.usage
    return [
        name,
        f"{stats.median:.2f} ({', '.join(f'{g:.2f}' for g in stats.goodputs)})",
        *([_num(best.best_level.good_tokens_per_s if best.best_level else 0.0)] if tokens else []),
        level.level if level and best.best_level else "none",
        "/".join(f"{e2e.get(p, float('nan')):.0f}" for p in ("p50", "p95", "p99")),
        *(f"{level.observed.get(str(s), float('nan')):.0f}" if level else "-" for s in slos),
        _num(usage.cpu_pct),
        _num(usage.rss_mib),
        *([_num(usage.gpu_util_pct)] if gpu else []),
        _num(best.start_s, 1),
        "yes" if stats.median > 0 else "no",
    ]


def summary_lines(outcome: Outcome) -> list[str]:
    lines = [outcome.verdict + "."]
    base = outcome.base
    if outcome.winner is not None:
        ratio = outcome.winner.median / base.median if base.median > 0 else float("inf")
        lines.append(
            f"winner: {key(outcome.winner.knobs)}: goodput {outcome.winner.median:.2f}/s vs "
            f"{base.median:.2f}/s for the current config ({ratio:.2f}x, same run)"
        )
    elif outcome.best is None:
        closest = closest_to_slo(outcome.stats)
        if closest is not None:
            lines.append(f"closest: {key(closest[0].knobs)} ({closest[1]})")
    if outcome.budget_ran_out:
        lines.append("the time budget ran out before the search ended")
    return lines


def closest_to_slo(stats: Sequence[Stats]) -> tuple[Stats, str] | None:
    """The candidate nearest to meeting the SLOs at its lightest level, and how near."""
    best: tuple[float, Stats, str] | None = None
    for s in stats:
        for run in s.measured:
            if not run.levels:
                continue
            level = run.levels[0]
            worst, text = max(
                (
                    (v / _limit(name), f"{name}: observed {v:.0f} ms")
                    for name, v in level.observed.items()
                ),
                default=(float("inf"), ""),
            )
            if best is None or worst < best[0]:
                best = (worst, s, f"at {level.level}, {text}")
    return (best[1], best[2]) if best else None


def to_json(outcome: Outcome, meta: TuneMeta) -> TuneResult:
    return {
        "meta": meta.copy(),
        "verdict": outcome.verdict,
        "budget_ran_out": outcome.budget_ran_out,
        "elapsed_s": outcome.elapsed_s,
        "current": outcome.base.knobs,
        "winner": outcome.winner.knobs if outcome.winner else None,
        "best": outcome.best.knobs if outcome.best else None,
        "candidates": [
            {
                "knobs": s.knobs,
                "goodput_median": s.median,
                "goodput_spread": list(s.spread),
                "failed": s.failed,
                "runs": [m.to_json() for m in s.runs],
            }
            for s in outcome.stats
        ],
    }


def write_json(path: Path, data: TuneResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def plot(outcome: Outcome, path: Path) -> Path | None:
    """Goodput and e2e p99 against load for the top candidates (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    shown = [s for s in outcome.stats if s.measured][:TOP_PLOTTED]
    if outcome.base not in shown and outcome.base.measured:
        shown.append(outcome.base)
    for stats in shown:
        run = max(stats.measured, key=lambda m: m.goodput)
        loads = [lv.load for lv in run.levels]
        label = key(stats.knobs) + (" (current)" if stats is outcome.base else "")
        left.plot(loads, [lv.goodput for lv in run.levels], marker="o", label=label)
        right.plot(loads, [lv.percentiles.get("e2e", {}).get("p99", float("nan")) / 1000
                           for lv in run.levels], marker="o", label=label)  # fmt: skip
    left.set(xlabel="load (concurrency or req/s)", ylabel="goodput (req/s meeting the SLOs)")
    right.set(xlabel="load (concurrency or req/s)", ylabel="end-to-end p99 (s)")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def config_change(text: str, pipeline: str, knobs: Mapping[str, Value]) -> str:
    """The config's TOML text with the pipeline's knobs set; comments and layout kept."""
    doc = tomlkit.parse(text)
    pipelines = doc.setdefault("pipelines", tomlkit.table(is_super_table=True))
    table = pipelines.setdefault(pipeline, tomlkit.table())
    for name, value in knobs.items():
        if name.startswith("options."):
            options = table.setdefault("options", tomlkit.table())
            options[name.removeprefix("options.")] = value
        else:
            table[name] = value
    return tomlkit.dumps(doc)


def diff(old: str, new: str, path: Path) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=str(path), tofile=f"{path} (tuned)",
        )
    )  # fmt: skip


def print_all(console: Console, outcome: Outcome, slos: Sequence[Slo]) -> None:
    console.print(table(outcome, slos))
    for line in summary_lines(outcome):
        console.print(line, highlight=False, markup=False)


def _limit(slo_text: str) -> float:
    """The limit in ms of an SLO written as `str(slo)` (`ttft_p99<=500ms`)."""
    return parse_duration_ms(slo_text.partition("<=")[2], slo_text)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _style(stats: Stats, outcome: Outcome) -> str | None:
    if stats is outcome.winner:
        return "bold green"
    if stats.failed:
        return "red"
    return None
