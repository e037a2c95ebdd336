"""A worker process's readings of its GPU or MIG slice through NVML (utilisation, memory),
and of its pipelines' backends (an LLM engine's own gauges: `Pipeline.readings`), written
to Redis every `interval_s` for the API's `/metrics`. Job ends and batches are
counted in the store's `MetricsTally` (`jobstore/store.py`, `workers/process.py`). Metrics
never stop a worker: errors are logged and dropped.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from host.devices import Usage, read_usage
from jobstore.readings import ReadingsStore
from pipelines.base import Pipeline

log = logging.getLogger(__name__)

Reader = Callable[[str], Usage | None]


@dataclass(frozen=True)
class Backend:
    """A pipeline of this process whose backend has readings (`Pipeline.readings`)."""

    worker: str
    pipeline: str
    readings: Callable[[], dict[str, float]]


def has_readings(pipeline: Pipeline[Any, Any]) -> bool:
    """Whether the pipeline's class says anything of its backend (`Pipeline.readings`)."""
    return type(pipeline).readings is not Pipeline.readings


def write_readings(
    store: ReadingsStore, host: str, backend: Backend, values: dict[str, float], ttl_s: int
) -> None:
    """Store one backend's readings; they expire after `ttl_s` (a gone worker's drop out)."""
    fields = {"host": host, "worker": backend.worker, "pipeline": backend.pipeline}
    store.write_backend(backend.worker, fields, values, ttl_s)


def write_usage(store: ReadingsStore, host: str, usage: Usage, ttl_s: int) -> None:
    """Store one reading; it expires after `ttl_s` (a gone worker's GPU drops out)."""
    util = "" if usage.utilization is None else repr(usage.utilization)
    fields = {
        "host": host,
        "device": usage.device,
        "uuid": usage.uuid,
        "name": usage.name,
        "memory_used_bytes": str(usage.memory_used_bytes),
        "memory_total_bytes": str(usage.memory_total_bytes),
        "utilization": util,
    }
    store.write_device(f"{host}/{usage.device}", fields, ttl_s)


class WorkerMetrics:
    def __init__(
        self,
        client: redis.Redis,
        device: str,
        *,
        interval_s: float = 5.0,
        read: Reader = read_usage,
        host: str | None = None,
        backends: Sequence[Backend] = (),
    ) -> None:
        self.readings = ReadingsStore(client)
        self.device = device
        self.backends = list(backends)
        self.interval_s = interval_s
        self.read = read
        self.host = host or socket.gethostname()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> bool:
        """Read the device and store the reading; False when there is nothing to read."""
        usage = self.read(self.device)
        if usage is None:
            return False
        write_usage(self.readings, self.host, usage, ttl_s=int(self.interval_s * 3) + 1)
        return True

    def sample_backends(self) -> None:
        """Read each backend and store what it says."""
        ttl_s = int(self.interval_s * 3) + 1
        for backend in self.backends:
            values = backend.readings()
            if values:
                write_readings(self.readings, self.host, backend, values, ttl_s)

    @property
    def _on_gpu(self) -> bool:
        return self.device.startswith(("gpu:", "mig:"))

    def start(self) -> None:
        """Sample the device (a GPU or MIG slice) and the backends in a thread."""
        if not self._on_gpu and not self.backends:
            return
        self._thread = threading.Thread(target=self._loop, name="worker-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1)

    def _loop(self) -> None:
        gpu = self._on_gpu
        while not self._stop.is_set():
            try:
                if gpu and not self.sample_once():
                    log.warning("no NVML reading of %s: GPU metrics off here", self.device)
                    gpu = False
                self.sample_backends()
            except redis.RedisError as exc:
                log.warning("readings not stored: %s", exc)
            if not gpu and not self.backends:
                return
            self._stop.wait(self.interval_s)
