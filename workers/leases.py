"""Leases on running jobs, worker liveness, and cancel requests, for one worker process.

One heartbeat thread renews every lease this process holds (a lease that could not be
renewed is lost: the job stops here and the reaper gives it to another worker), marks the
worker alive (with its jobs in flight and the size of the batch it runs now, in the same
write), and re-reads cancel flags in case a pub/sub notice was missed. One listener
thread turns cancel notices into the held job's cancel event at once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from common.redis_client import FAILOVER_ERRORS
from jobs.settings import Settings
from jobstore.changes import Lease
from jobstore.liveness import LivenessStore
from jobstore.store import JobStore

log = logging.getLogger(__name__)


@dataclass
class Held:
    lease: Lease
    cancel: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    renewed_at: float = field(default_factory=time.monotonic)
    """When the lease was last taken or renewed (this process's clock)."""
    ended: bool = False
    """The run is recording its end, which gives the lease up: a renewal that finds it gone
    then is no loss."""
    handing_back: bool = False
    """Its worker is stopping (`workers.shutdown`): the run stops (`cancel`) and queues the
    job again instead of ending it."""


class LeaseKeeper:
    def __init__(
        self,
        store: JobStore,
        settings: Settings,
        name: str,
        info: dict[str, str],
        batch_size: Callable[[], int] | None = None,
    ):
        self.store = store
        self.settings = settings
        self.name = name
        self.info = {**info, "pid": str(os.getpid()), "host": settings.host_name}
        self.batch_size = batch_size
        """Requests in the batches running now (the engine's), for the heartbeat."""
        self._held: dict[str, Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.liveness = LivenessStore(store.r)
        self._pubsub: Any = None
        self._threads = [
            threading.Thread(target=self._beat_loop, name="lease-heartbeat", daemon=True),
            threading.Thread(target=self._listen_loop, name="cancel-listener", daemon=True),
        ]

    def new_lease(self) -> Lease:
        return Lease(token=f"{self.name}:{uuid.uuid4().hex}", ttl_ms=self._ttl_ms)

    @property
    def _ttl_ms(self) -> int:
        return int(self.settings.lease.ttl_s * 1000)

    def hold(self, job_id: str, lease: Lease) -> Held:
        held = Held(lease)
        with self._lock:
            self._held[job_id] = held
        return held

    def release(self, job_id: str) -> None:
        with self._lock:
            self._held.pop(job_id, None)

    def start(self) -> None:
        self._pubsub = self.liveness.cancel_notices()
        self._mark_alive()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(2 * self.settings.lease.heartbeat_s)
        if self._pubsub is not None:
            self._pubsub.close()
        self.liveness.leave(self.name)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.settings.lease.heartbeat_s):
            try:
                self._beat()
            except FAILOVER_ERRORS as exc:
                # Redis down or failing over: keep the jobs and try again next beat, until a
                # lease would have run out (the reaper may then give its job to another worker).
                log.warning("heartbeat failed: %s: %s", type(exc).__name__, exc)
                self._drop_expired()
            except redis.RedisError:
                log.exception("heartbeat failed")
                self._drop_expired()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [
                (job_id, entry)
                for job_id, entry in self._held.items()
                if now - entry.renewed_at > self.settings.lease.ttl_s
            ]
        for job_id, entry in expired:
            log.warning("lease of job %s ran out while Redis was unreachable; stopping it", job_id)
            entry.lost.set()
            entry.cancel.set()

    def _beat(self) -> None:
        with self._lock:
            held = dict(self._held)
        renewing_at = time.monotonic()
        renewed = self.store.renew_leases([(job_id, e.lease) for job_id, e in held.items()])
        for (job_id, entry), ok in zip(held.items(), renewed, strict=True):
            if ok:
                entry.renewed_at = renewing_at
                continue
            with self._lock:
                still_held = self._held.get(job_id) is entry
            if still_held and not entry.ended:  # not a job that ended meanwhile
                log.warning("lost the lease of job %s; stopping it here", job_id)
                entry.lost.set()
                entry.cancel.set()
        for job_id in self.store.stop_requested(list(held)):
            held[job_id].cancel.set()
        self._mark_alive()

    def _mark_alive(self) -> None:
        now = self.store.server_time()  # Redis's clock: readers compare with it too
        with self._lock:
            in_flight = len(self._held)
        # What it does now rides on the beat it makes anyway (the admin overview reads it).
        live = {
            "in_flight": str(in_flight),
            "batch_size": str(self.batch_size() if self.batch_size else 0),
        }
        ttl_s = int(self.settings.lease.heartbeat_s * 5) + 1
        self.liveness.beat(self.name, now, {**self.info, **live}, ttl_s)

    def _listen_loop(self) -> None:
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=0.5)
            except (redis.RedisError, ValueError) as exc:
                if self._stop.is_set():
                    return
                if isinstance(exc, FAILOVER_ERRORS):
                    log.warning("cancel listener failed: %s: %s", type(exc).__name__, exc)
                else:
                    log.exception("cancel listener failed")
                time.sleep(0.5)
                continue
            if message and message["type"] == "message":
                with self._lock:
                    entry = self._held.get(str(message["data"]))
                if entry is not None:
                    entry.cancel.set()
