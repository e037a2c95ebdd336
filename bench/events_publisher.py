"""The publisher of `bench.events`: a child process that acts as the worker, appending
one PROGRESS event per job per round through the job store (XADD + PUBLISH), each stamped
with the time just before it is sent: one append at a time (`--publish-batch 1`), or
`batch` events per script call, as a worker's event writer writes what its jobs made
meanwhile (`workers.event_writer`), each event stamped just before its call."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import redis
from redis.exceptions import RedisError

from jobs.models import EventType
from jobs.settings import load_settings
from jobstore.store import JobStore, NewEvent

BENCH_CLIENT_PREFIX = "mmq-bench"
"""Redis client names of the benchmark's own connections (told apart in CLIENT LIST)."""
PUBLISHER_CLIENT = f"{BENCH_CLIENT_PREFIX}-publisher"


@dataclass
class PublishReport:
    published: int
    elapsed_s: float
    errors: dict[str, int]


def publish_round(
    store: JobStore, round_no: int, job_ids: list[str], batch: int = 1
) -> PublishReport:
    """One PROGRESS event per job, `batch` per script call, each stamped just before its
    call."""
    errors: Counter[str] = Counter()
    start = time.perf_counter()
    published = 0
    for at in range(0, len(job_ids), batch):
        sent_ns = time.time_ns()
        events = [
            NewEvent(job_id, EventType.PROGRESS, {"sent_ns": sent_ns, "round": round_no})
            for job_id in job_ids[at : at + batch]
        ]
        try:
            published += sum(1 for event_id in store.append_events(events) if event_id)
        except RedisError as exc:
            errors[f"publish: {type(exc).__name__}: {exc}"[:200]] += len(events)
    return PublishReport(published, time.perf_counter() - start, dict(errors))


def publisher_main(conn: Connection, config: str, redis_url: str, batch: int) -> None:
    """Child process: answers each (round, job ids) order with a PublishReport."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    settings = load_settings(Path(config), redis_url=redis_url)
    client = redis.Redis.from_url(redis_url, decode_responses=True, client_name=PUBLISHER_CLIENT)
    store = JobStore(client, settings)
    client.ping()
    conn.send("ready")
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        while (order := conn.recv()) is not None:
            round_no, job_ids = order
            conn.send(publish_round(store, round_no, job_ids, batch))
    client.close()


class Publisher:
    """The parent's handle on the publisher process."""

    def __init__(self, config: Path, redis_url: str, batch: int = 1) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=publisher_main,
            args=(child_conn, str(config.resolve()), redis_url, batch),
            name="mmq-bench-publisher",
            daemon=True,
        )
        self._process.start()
        child_conn.close()
        try:
            ready = self._conn.poll(60) and self._conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.stop()
            raise RuntimeError(f"the publisher process did not start ({self._process.exitcode})")

    def publish(self, round_no: int, job_ids: list[str]) -> PublishReport:
        self._conn.send((round_no, job_ids))
        report: PublishReport = self._conn.recv()
        return report

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self._conn.send(None)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()


@contextlib.contextmanager
def publisher_process(config: Path, redis_url: str, batch: int = 1) -> Iterator[Publisher]:
    publisher = Publisher(config, redis_url, batch)
    try:
        yield publisher
    finally:
        publisher.stop()
