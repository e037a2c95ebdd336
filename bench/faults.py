"""Faults under load: what happens to every job that got a 202.

    python -m bench.faults [--scenarios crash-memory,crash-fsync,failover-memory,...]
                           [--duration-s 20]
                           [--down-s 0.5] [--clients 4] [--out bench/results/faults.json]

Each scenario starts its own Redis (valkey) server, the API, the reaper and two workers
(echo and sleep jobs, as the tests' deployment), then submits jobs back to back from
`--clients` threads for `--duration-s`; halfway through, the fault:

- `crash-memory`: SIGKILL the server (`appendonly yes`, `appendfsync everysec`,
  `redis.durability = memory`) and start it again on its data dir `--down-s` later;
- `crash-fsync`: the same at `redis.durability = fsync` (`appendfsync always`);
- `failover-memory`: a primary, a replica and three sentinels (`down-after-milliseconds`
  2000); SIGKILL the primary; once Sentinel has promoted the replica, the old primary
  comes back empty as its replica (as an operator or orchestrator would);
- `failover-replica`: the same at `redis.durability = replica` (a 202 waits for the
  replica; with the one replica gone, nothing is confirmed until the old primary is back).

Then it waits for every accepted job to end and counts: accepted, succeeded, failed,
lost (no end, or no record), run twice (more than one `running` event: at-least-once
delivery after a crash), ended twice, the seconds from the fault to the first 202 of a
submit sent after it, and the other answers (503s, connection errors). Lost and ended
twice must be 0 at the durable levels. A process SIGKILL leaves the server's writes in
the page cache, so `memory` loses nothing here; a host crash or power loss within the
last second would (not simulated).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import run_meta
from harness.faults import FaultRun, under_load
from host.redis_server import RedisServer

console = Console(width=140)
DURABILITY = {
    "crash-memory": "memory",
    "crash-fsync": "fsync",
    "failover-memory": "memory",
    "failover-replica": "replica",
}
"""Scenario -> redis.durability."""


def row(name: str, run: FaultRun) -> dict[str, Any]:
    return {
        "scenario": name,
        **asdict(run.tally),
        "recover_s": run.recover_s,
        "others": run.others,
    }


def crash(args: argparse.Namespace, name: str, tmp: Path) -> dict[str, Any]:
    """SIGKILL the one server, start it again on its data dir `--down-s` later."""
    server = RedisServer(tmp / "redis", fsync_always=DURABILITY[name] == "fsync").start()

    def fault(base_url: str) -> None:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        time.sleep(args.down_s)
        server.start()

    try:
        run = under_load(server.url, tmp, DURABILITY[name], fault, args.duration_s, args.clients)
        return row(name, run)
    finally:
        server.stop()


def failover(args: argparse.Namespace, name: str, tmp: Path) -> dict[str, Any]:
    """SIGKILL the primary of a Sentinel group; once the replica is promoted, the old
    primary comes back (empty) as its replica, as an operator or orchestrator would."""
    from harness.sentinel import SentinelGroup

    with SentinelGroup(tmp / "group") as group:

        def fault(base_url: str) -> None:
            group.kill_primary()
            group.wait_promoted(timeout_s=60)
            group.restart_primary(timeout_s=60)

        run = under_load(group.url, tmp, DURABILITY[name], fault, args.duration_s, args.clients)
        return row(name, run)


SCENARIOS: dict[str, Callable[[argparse.Namespace, str, Path], dict[str, Any]]] = {
    "crash-memory": crash,
    "crash-fsync": crash,
    "failover-memory": failover,
    "failover-replica": failover,
}


COLUMNS = ["accepted", "succeeded", "failed", "lost", "run_twice", "ended_twice"]


def report(rows: list[dict[str, Any]]) -> None:
    table = Table(title="Faults under load: every accepted job accounted for")
    table.add_column("scenario")
    for column in [*COLUMNS, "recover s", "other answers"]:
        table.add_column(column, justify="right")
    for row in rows:
        recover = f"{row['recover_s']:.2f}" if row["recover_s"] is not None else "-"
        others = ", ".join(f"{k}: {v}" for k, v in row["others"].items()) or "-"
        table.add_row(row["scenario"], *(str(row[c]) for c in COLUMNS), recover, others)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--down-s", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("bench/results/faults.json"))
    args = parser.parse_args(argv)
    names = [s for s in args.scenarios.split(",") if s]
    if unknown := set(names) - set(SCENARIOS):
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {list(SCENARIOS)}")
    rows = []
    for name in names:
        console.print(f"{name}: {args.duration_s:g} s of load, the fault halfway")
        with tempfile.TemporaryDirectory(prefix=f"mmq-faults-{name}-") as tmp:
            rows.append(SCENARIOS[name](args, name, Path(tmp)))
    report(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": run_meta(),
        "results": rows,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results written to {args.out}")
    durable = [r for r in rows if DURABILITY[r["scenario"]] != "memory"]
    bad = [r for r in durable if r["lost"] or r["ended_twice"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
