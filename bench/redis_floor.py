"""Redis's own CPU per event: the store's append of a worker's write (`APPEND_EVENTS`:
the lease checked, the event appended to its job's stream, one notice for the write)
beside the bare commands under it, on one Redis of this machine.

    python -m bench.redis_floor [--events-per-write 32] [--writes 1500] [--runs 2]
                                [--out FILE.json]

Each write is `--events-per-write` events of as many jobs (a token each, as a worker's
event writer writes 256 streams of one token per engine step), sent as one script call;
the same events are then sent as pipelined `XADD`s alone (what the durable record needs at
the least) and pipelined `SET`s (a command's floor). Reported: Redis's CPU (`INFO cpu`)
per event for each, so that the script's cost can be read against what no design that
appends each event to its job's stream can go under.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.common import redis_cpu_s, run_meta, write_runs
from host.redis_server import RedisServer
from jobs import keys
from jobs.models import EventType
from jobs.settings import Settings
from jobstore.store import JobStore, NewEvent

DEFAULT_OUT = Path("bench/results/redis_floor.json")


def _data(n: int) -> bytes:
    return b'{"index":%d,"text":" hello"}' % n


def run(url: str, args: argparse.Namespace, tag: str) -> dict[str, float]:
    client = redis.Redis.from_url(url, decode_responses=True)
    store = JobStore(client, Settings(redis_url=url))
    listener = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]  # redis-py: unannotated
    listener.subscribe(keys.EVENTS_CHANNEL)  # a subscriber, as an API that follows streams
    jobs = [f"job_floor_{tag}_{i}" for i in range(args.events_per_write)]
    for job in jobs:
        client.set(keys.lease(job), "run")

    def script(n: int) -> None:
        events = [
            NewEvent(j, EventType.PARTIAL, _data(n), False, lease_token="run", text_at=18)
            for j in jobs
        ]
        store.append_events(events)
        while listener.get_message(timeout=0):
            pass

    def xadds(n: int) -> None:
        pipe = client.pipeline(transaction=False)
        for job in jobs:
            fields: dict[bytes | bytearray | memoryview[int] | str | int | float, Any] = {
                "type": "partial",
                "data": _data(n),
                "ts": "1764400000.123",
            }
            pipe.xadd(f"{keys.job_events(job)}:bare", fields, maxlen=10_000, approximate=True)
        pipe.execute()

    def sets(n: int) -> None:
        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.set(f"{keys.job(job)}:bare", _data(n))
        pipe.execute()

    out: dict[str, float] = {}
    ways: dict[str, Callable[[int], None]] = {"script": script, "xadd": xadds, "set": sets}
    for name, write in ways.items():
        before = redis_cpu_s(client)
        for n in range(args.writes):
            write(n)
        spent = redis_cpu_s(client) - before
        out[f"{name}_us_per_event"] = round(spent / (args.writes * len(jobs)) * 1e6, 2)
    listener.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_floor", description=__doc__)
    parser.add_argument("--events-per-write", type=int, default=32)
    parser.add_argument("--writes", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mmq-redis-floor-") as tmp:
        server = RedisServer(Path(tmp), persist=False).start()
        try:
            runs = [run(server.url, args, str(i)) for i in range(args.runs)]
        finally:
            server.stop()
    for i, row in enumerate(runs, 1):
        print(
            f"run {i}: Redis CPU per event: the store's append {row['script_us_per_event']} µs,"
            f" a pipelined XADD {row['xadd_us_per_event']} µs, a pipelined SET"
            f" {row['set_us_per_event']} µs"
        )
    meta = run_meta(events_per_write=args.events_per_write, writes=args.writes)
    write_runs(args.out, meta, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
