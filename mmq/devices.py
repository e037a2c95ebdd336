"""`mmq devices`: what discovery found, and the worker plan for this host, as tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from host.devices import GIB, Topology
from host.placement import Plan


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n else "-"


def print_topology(console: Console, topology: Topology) -> None:
    table = Table(title="devices", title_justify="left")
    for column in ("device", "name", "uuid", "memory total", "memory free", "note"):
        table.add_column(column)
    for d in topology.devices:
        note = ""
        if d.kind == "gpu" and d.mig_enabled:
            note = "MIG on: workers go on its slices"
        elif d.kind == "mig":
            note = f"slice of {d.parent}"
        table.add_row(d.id, d.name, d.uuid, _gib(d.total_bytes), _gib(d.free_bytes), note)
    console.print(table)
    if topology.driver:
        console.print(f"NVIDIA driver {topology.driver}")
    if topology.note:
        console.print(f"CPU only: {topology.note}")


def print_plan(console: Console, plan: Plan) -> None:
    table = Table(title="workers", title_justify="left")
    for column in ("device", "pipeline", "instance", "memory (est.)", "from", "knobs"):
        table.add_column(column)
    for a in plan.assignments:
        knobs = " ".join(f"{k}={v}" for k, v in a.overrides.items())
        memory = _gib(a.estimate.bytes) if a.estimate.known else "?"
        table.add_row(a.device.id, a.pipeline, str(a.instance), memory, a.estimate.source, knobs)
    console.print(table)
    for warning in plan.warnings:
        console.print(f"[yellow]warning[/]: {warning}")
