"""A worker process's readings of its GPU or MIG slice through NVML (utilisation, memory),
written to Redis every `interval_s` for the API's `/metrics`. Job ends and batches are
counted in the store's `MetricsTally` (`jobstore/store.py`, `workers/process.py`). Metrics
never stop a worker: errors are logged and dropped.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

import redis

from host.devices import Usage, read_usage
from jobs import keys
from jobstore.codec import time_seconds

log = logging.getLogger(__name__)

Reader = Callable[[str], Usage | None]


def write_usage(client: redis.Redis, host: str, usage: Usage, ttl_s: int) -> None:
    """Store one reading; it expires after `ttl_s` (a gone worker's GPU drops out)."""
    name = f"{host}/{usage.device}"
    util = "" if usage.utilization is None else repr(usage.utilization)
    pipe = client.pipeline(transaction=False)
    pipe.hset(
        keys.device(name),
        mapping={
            "host": host,
            "device": usage.device,
            "uuid": usage.uuid,
            "name": usage.name,
            "memory_used_bytes": str(usage.memory_used_bytes),
            "memory_total_bytes": str(usage.memory_total_bytes),
            "utilization": util,
        },
    )
    pipe.expire(keys.device(name), ttl_s)
    pipe.zadd(keys.DEVICES, {name: time_seconds(client.time())})
    pipe.execute()


class WorkerMetrics:
    def __init__(
        self,
        client: redis.Redis,
        device: str,
        *,
        interval_s: float = 5.0,
        read: Reader = read_usage,
        host: str | None = None,
    ) -> None:
        self.r = client
        self.device = device
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
        write_usage(self.r, self.host, usage, ttl_s=int(self.interval_s * 3) + 1)
        return True

    def start(self) -> None:
        """Sample the device in a thread, where it is a GPU or MIG slice."""
        if not self.device.startswith(("gpu:", "mig:")):
            return
        self._thread = threading.Thread(target=self._loop, name="gpu-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 1)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.sample_once():
                    log.warning("no NVML reading of %s: GPU metrics off here", self.device)
                    return
            except redis.RedisError as exc:
                log.warning("GPU reading not stored: %s", exc)
            self._stop.wait(self.interval_s)
