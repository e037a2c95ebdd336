"""The metric counters in Redis that every process adds to, so that one scrape of the
API's `/metrics` sees the whole deployment (`telemetry/metric_defs.py` defines them).

Each metric is one hash, `keys.metric(name)`. A counter's fields are the JSON list of its
label values; a histogram's fields are its label values plus either a bucket's upper
bound (an observation adds 1 to the one bucket it falls in; the renderer makes them
cumulative) or `"sum"`.

`queue_samples` queues the writes of samples on a Redis pipeline that the caller
executes, so a job's end costs one round trip (the API). `MetricsTally` adds them up in
a process and writes them once per interval (workers, the reaper, the scheduler): a
worker ends jobs and runs batches at a rate where a Redis round trip for each (a dozen
HINCRBYs) costs more than the job itself. `MetricsTally.add` only adds, under a lock, to
what this process owes Redis; a flusher thread writes it every `interval_s` in one
MULTI/EXEC (all or nothing, so a failed write is kept and retried whole, never counted
twice), and `stop` writes the rest. A scrape sees a job's end at most `interval_s` after
it; a process killed with SIGKILL loses at most its last interval of counts, never a job.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

import redis

from jobs import keys
from telemetry.metric_defs import Sample, bucket_of, field_of

log = logging.getLogger(__name__)

Cell = tuple[str, str]
"""(hash key, field) of one count or sum."""


class CommandQueue(Protocol):
    """A sync or asyncio Redis pipeline: commands are queued, the caller executes."""

    def hincrby(self, name: str, key: str, amount: int = 1) -> object: ...

    def hincrbyfloat(self, name: str, key: str, amount: float = 1.0) -> object: ...


def queue_samples(pipe: CommandQueue, samples: Iterable[Sample]) -> None:
    """Queue the writes of `samples` on `pipe`."""
    for metric, labels, value in samples:
        key = keys.metric(metric.name)
        if metric.histogram:
            pipe.hincrby(key, field_of(labels, bucket_of(metric, value)), 1)
            pipe.hincrbyfloat(key, field_of(labels, "sum"), value)
        else:
            pipe.hincrby(key, field_of(labels), int(value))


class MetricsTally:
    def __init__(self, client: redis.Redis, interval_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.r = client
        self.interval_s = interval_s
        self._counts: Counter[Cell] = Counter()
        self._sums: dict[Cell, float] = {}
        self._expiring: dict[str, int] = {}
        """Keys of counts that expire (`count`), with their TTL, set again at each write."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, samples: Iterable[Sample]) -> None:
        """Count `samples` (never touches Redis; safe from any thread)."""
        with self._lock:
            for metric, labels, value in samples:
                key = keys.metric(metric.name)
                if metric.histogram:
                    self._counts[(key, field_of(labels, bucket_of(metric, value)))] += 1
                    cell = (key, field_of(labels, "sum"))
                    self._sums[cell] = self._sums.get(cell, 0.0) + value
                else:
                    self._counts[(key, field_of(labels))] += int(value)

    def count(self, cells: Iterable[tuple[str, str, int]], ttl_s: int) -> None:
        """Add to (hash key, field) counts whose keys expire `ttl_s` after their last
        write (the overview's per-minute counts, `jobstore/recent_counts.py`)."""
        with self._lock:
            for key, name, amount in cells:
                self._counts[(key, name)] += amount
                self._expiring[key] = ttl_s

    def pending(self) -> bool:
        with self._lock:
            return bool(self._counts or self._sums)

    def flush(self) -> bool:
        """Write what was added since the last flush; False (and kept) if Redis failed."""
        with self._lock:
            counts, sums, expiring = self._counts, self._sums, self._expiring
            self._counts, self._sums, self._expiring = Counter(), {}, {}
        if not counts and not sums:
            return True
        try:
            pipe = self.r.pipeline(transaction=True)
            for (key, name), count in counts.items():
                pipe.hincrby(key, name, count)
            for (key, name), total in sums.items():
                pipe.hincrbyfloat(key, name, total)
            for key, ttl_s in expiring.items():
                pipe.expire(key, ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("metrics not written (kept for the next try): %s", exc)
            with self._lock:
                self._counts.update(counts)
                self._expiring.update(expiring)
                for cell, total in sums.items():
                    self._sums[cell] = self._sums.get(cell, 0.0) + total
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="metrics-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the flusher and write what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()
