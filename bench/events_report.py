"""The results of `bench.events`: one record per level of open streams, the tables
printed at the end, and the JSON written beside them."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.overhead import jsonable

GOALS_P50_MS = {1: 2.0, 1000: 20.0}
"""Streams -> the p50 delay goal in milliseconds."""
GOALS_EVENTS_PER_S = {1000: 4 * 2_800}
"""Streams -> the goal for events/s through the one API process: 4x the 2,800 it carried
at 1,000 SSE streams before issue 31."""
PUBLISHER_BOUND = 0.9
"""A level whose API received at least this share of the publisher's pace was bounded by
the publisher (one append at a time), not by the API: its events/s is the publisher's."""

console = Console(width=None if sys.stdout.isatty() else 120)
"""Tables stay unwrapped when the output goes to a file or a pipe."""


@dataclass
class RedisClients:
    """Redis connections seen by `CLIENT LIST` while a level's streams were open."""

    total: int
    bench: int
    """This process's own: the publisher and the probe that counts."""
    others: int
    """Everything else: the API's (its pub/sub one, its pool, Celery's) and any others."""
    subscribers: int
    """Connections in pub/sub mode (the API's hub holds one per process)."""


@dataclass
class LevelResult:
    streams: int
    rounds: int
    transport: str
    """`sse`, or `ws` (the job's websocket)."""
    published: int
    """Events published in the measured rounds: one per open stream per round (a stream
    that failed to open gets none and counts as a failure)."""
    received: int
    failures: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    events_per_s: float
    """Received events over the summed spans of the rounds (first send to last receipt)."""
    publish_per_s: float
    """Events the publisher wrote per second (its own pace: one append at a time)."""
    open_s: float
    """Time to open every stream and see its replayed `queued` event."""
    goal_p50_ms: float | None
    goal_met: bool | None
    goal_events_per_s: float | None = None
    run: int = 1
    """Which run of `--runs` it belongs to."""
    api_cpu_us_per_event: float | None = None
    """The API process's CPU time over the rounds per event published (warm-up included)."""
    api_rss_kb: dict[str, int | None] = field(default_factory=dict)
    """The API process's RSS: before opening the streams, with them open, after the rounds."""
    redis_clients: RedisClients | None = None
    errors: dict[str, int] = field(default_factory=dict)


DELAY_COLUMNS = ("run", "via", "streams", "rounds", "events", "p50 ms", "p90 ms", "p99 ms",
                 "max ms", "events/s", "events/s goal", "bound by", "p50 goal", "fail")  # fmt: skip
COST_COLUMNS = ("via", "streams", "API RSS MiB", "KiB/stream", "API CPU us/event", "Redis conns",
                "bench", "API+other", "pub/sub", "open s")  # fmt: skip
RSS_POINTS = ("before_streams", "streams_open", "after_rounds")


def print_progress(r: LevelResult) -> None:
    console.print(
        f"  {r.streams} {r.transport} stream(s): p50 {r.p50_ms:.2f} ms  p99 {r.p99_ms:.2f} ms  "
        f"{r.received}/{r.published} events  failures {r.failures}",
        highlight=False,
    )


def fmt_mib(kb: int | None) -> str:
    return "-" if kb is None else f"{kb / 1024:,.1f}"


def goal_text(r: LevelResult) -> str:
    if r.goal_p50_ms is None or r.goal_met is None:
        return "-"
    verdict = "[green]met[/green]" if r.goal_met else "[red]not met[/red]"
    return f"<={r.goal_p50_ms:g} {verdict}"


def new_table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    return table


def bound_by(r: LevelResult) -> str:
    """What limited the level's events/s: the publisher's pace, or the API."""
    if r.publish_per_s <= 0:
        return "-"
    return "publisher" if r.events_per_s >= PUBLISHER_BOUND * r.publish_per_s else "API"


def events_goal_text(r: LevelResult) -> str:
    goal = r.goal_events_per_s
    if goal is None:
        return "-"
    met = r.events_per_s >= goal
    verdict = (
        "met" if met else ("missed (publisher-bound)" if bound_by(r) == "publisher" else "missed")
    )
    return f">={goal:,.0f} {verdict}"


def delay_row(r: LevelResult) -> list[str]:
    return [
        str(r.run),
        r.transport,
        str(r.streams),
        str(r.rounds),
        f"{r.received}/{r.published}",
        *(f"{ms:.2f}" for ms in (r.p50_ms, r.p90_ms, r.p99_ms, r.max_ms)),
        f"{r.events_per_s:,.0f}",
        events_goal_text(r),
        bound_by(r),
        goal_text(r),
        str(r.failures),
    ]


def delay_table(results: list[LevelResult]) -> Table:
    title = "Event delay: worker publish -> client receipt (SSE or websocket), one API process"
    table = new_table(title, DELAY_COLUMNS)
    for r in results:
        table.add_row(*delay_row(r), style="red" if r.failures else None)
    return table


def per_stream_kib(r: LevelResult) -> str:
    before, opened = r.api_rss_kb.get("before_streams"), r.api_rss_kb.get("streams_open")
    if before is None or opened is None:
        return "-"
    return f"{(opened - before) / r.streams:,.1f}"


def cost_row(r: LevelResult) -> list[str]:
    rss = " / ".join(fmt_mib(r.api_rss_kb.get(point)) for point in RSS_POINTS)
    cpu = "-" if r.api_cpu_us_per_event is None else f"{r.api_cpu_us_per_event:,.0f}"
    c = r.redis_clients
    conns = [str(c.total), str(c.bench), str(c.others), str(c.subscribers)] if c else ["-"] * 4
    return [r.transport, str(r.streams), rss, per_stream_kib(r), cpu, *conns, f"{r.open_s:.2f}"]


def cost_table(results: list[LevelResult]) -> Table:
    title = "What the streams cost (API RSS: before / streams open / after rounds)"
    table = new_table(title, COST_COLUMNS)
    for r in results:
        table.add_row(*cost_row(r))
    return table


def print_report(results: list[LevelResult], out: Path) -> None:
    console.print()
    console.print(delay_table(results))
    console.print(cost_table(results))
    for r in results:
        console.print(
            f"run {r.run}, {r.streams} stream(s): publisher {r.publish_per_s:,.0f} appends/s, "
            f"received {r.events_per_s:,.0f} events/s: bound by the {bound_by(r)}",
            highlight=False,
        )
        for error, count in r.errors.items():
            console.print(f"[red]{r.streams} stream(s): {count} x {error}[/red]")
    console.print(f"results written to {out}")


def write_json(out: Path, meta: dict[str, Any], results: list[LevelResult]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "goals": {"p50_ms_by_streams": {str(k): v for k, v in GOALS_P50_MS.items()}},
        "results": [asdict(r) for r in results],
    }
    out.write_text(json.dumps(jsonable(payload), indent=2) + "\n")
