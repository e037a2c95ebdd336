"""Where a worker's model lives: loaded when the worker starts and held (`resident`, the
default), or loaded when a job comes and unloaded when idle (`on_demand`).

Every worker's model is counted on its device (`keys.device_models`: the worker, its
pipeline, its estimated bytes, since when it is loaded and since when it is idle), so
that the models of a device fit its budget (`device_memory_gb`, else a GPU's total
memory). An on-demand worker that gets a job while its model is unloaded:

1. says so on the job (a `status` event `{"status": "running", "loading": PIPELINE}`);
2. claims room on the device (`CLAIM` in `jobstore.device_room`, one script): it fits,
   or the least recently idle models that have been loaded for `min_loaded_s` are asked
   to make room, and it tries again; a worker whose heartbeat stopped holds no room;
3. loads and warms the model up, once: jobs that come meanwhile wait for the same load.
   Each job that waited records `load_ms` in its timings.

A watcher thread unloads the model when it has had no job running and none waiting in
its queue for `idle_unload_s`, or at once when a claim asks for its room and it is idle.
A model with a job running, or jobs waiting in its queue, is never unloaded. A claim
that finds no idle model says that it waits (`keys.device_waiting`), and the scheduler
stops feeding the models in its way that have been loaded for `min_loaded_s`: they finish
what their queue holds, go idle and make room, while their new jobs are held for their
next turn. So under alternating load the models of a device take turns, each serving a
batch of its waiting jobs, and a device loads at most one model per `min_loaded_s`. The
job fails if no room comes in `ROOM_WAIT_S`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis

from broker.kombu_redis import PRIORITY_VALUES, priority_list
from broker.queues import queue_name
from host.devices import read_usage
from host.model_memory import estimate
from jobs.settings import Settings
from jobstore.device_room import DeviceRoom
from jobstore.metric_counts import MetricsTally
from pipelines.base import Pipeline
from telemetry.metric_defs import MODEL_LOAD_SECONDS, MODEL_LOADS, MODEL_UNLOADS

log = logging.getLogger(__name__)

GIB = 1024**3
WATCH_S = 0.2
"""How often the watcher looks for an idle model to unload, and a claim tries again."""
ROOM_WAIT_S = 600.0
"""How long a job waits for room on its device before it fails."""
STALE_BEATS = 3
"""A worker whose heartbeat is this many periods old holds no room."""


class NoRoom(RuntimeError):
    """The device had no room for the model within `ROOM_WAIT_S`."""


class Residency(Protocol):
    """What a job's run asks of where its model lives."""

    def defer(self, job_id: str) -> bool:
        """Before the job starts: True where this worker gave the job back to its queue
        for a worker whose model is warm (this one's is not loaded)."""
        ...

    def acquire(self, announce: Callable[[], None], canceled: threading.Event) -> float:
        """Before the job runs: the model loaded (`announce` is called first where it must
        load or wait for a load). Returns the milliseconds the job waited for it."""
        ...

    def release(self) -> None:
        """After the job ran."""
        ...


class Resident:
    """Loaded when the worker started; held until it stops."""

    def __init__(self, room: DeviceRoom, pipeline: Pipeline[Any, Any], nbytes: int) -> None:
        self.room = room
        self.pipeline = pipeline
        self.nbytes = nbytes

    def defer(self, job_id: str) -> bool:
        return False

    def acquire(self, announce: Callable[[], None], canceled: threading.Event) -> float:
        return 0.0

    def release(self) -> None:
        pass

    def start(self) -> None:
        try:
            self.room.hold(self.pipeline.name, self.nbytes)
        except redis.RedisError as exc:
            log.warning("could not count %s on %s: %s", self.pipeline.name, self.room.device, exc)

    def stop(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.room.free()


class OnDemand:
    """Loaded when a job comes, unloaded when idle or when another model needs the room."""

    def __init__(
        self,
        pipeline: Pipeline[Any, Any],
        room: DeviceRoom,
        tally: MetricsTally,
        nbytes: int,
        budget: int,
        push_back: Callable[[str], None] | None = None,
        exit_process: Callable[[], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.push_back = push_back
        """Puts a job's message back at the front of its queue (`defer`)."""
        self.exit_process = exit_process
        """Ends the worker process, as SIGTERM does (`exit_after_unload`)."""
        self.room = room
        self.tally = tally
        self.nbytes = nbytes
        self.budget = budget
        config = pipeline.config
        self.idle_unload_s = config.idle_unload_s
        self.min_loaded_s = config.min_loaded_s
        self.slots = pipeline.knobs().concurrency
        self.loaded = False
        self.parked = False
        """Unloaded by `Pipeline.park` (an engine asleep): freed for good at the stop."""
        self._model_lock = threading.Lock()
        """Held while the model loads or unloads."""
        self._cv = threading.Condition()
        self._note_lock = threading.Lock()
        self._noted: tuple[bool, bool] | None = None
        """(idle, full) as last written to the model's entry; None: not since it loaded."""
        self._in_flight = 0
        self._idle_since = time.monotonic()
        self._stop = threading.Event()
        self._queues = [
            priority_list(queue_name(pipeline.name), step) for step in PRIORITY_VALUES.values()
        ]
        self._thread = threading.Thread(target=self._watch, name="residency", daemon=True)

    # -- a job's run

    def defer(self, job_id: str) -> bool:
        """A cold worker gives a job back while another worker of its pipeline has the
        model loaded and a free slot (idle, or an LLM engine with room in its batch): that
        one takes it next (the message goes back to the front of the queue), and no second
        copy of the model is loaded for it. A warm worker with every slot busy does not
        count: a burst beyond its slots spills over onto cold workers, which load."""
        if self.loaded or self.push_back is None:
            return False
        try:
            warm = self.room.warm_sibling(self.pipeline.name)
        except redis.RedisError:
            return False
        if warm is None:
            return False
        self.push_back(job_id)
        log.info("job %s: left to %s, where %s is loaded", job_id, warm, self.pipeline.name)
        return True

    def acquire(self, announce: Callable[[], None], canceled: threading.Event) -> float:
        with self._cv:
            self._in_flight += 1
        if self.loaded:
            self._note_use()
            return 0.0
        started = time.monotonic()
        announce()
        with self._model_lock:
            if not self.loaded:
                self._load(canceled)
        self._note_use()
        return (time.monotonic() - started) * 1000

    def release(self) -> None:
        with self._cv:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle_since = time.monotonic()
        if self.loaded:
            self._note_use()

    # -- the worker's life

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._model_lock:
            if self.loaded:
                self._unload("stopped")
            elif self.parked:
                self.pipeline.unload()
                self.parked = False

    # -- loading and unloading

    def _load(self, canceled: threading.Event) -> None:
        name, device = self.pipeline.name, self.room.device
        deadline = time.monotonic() + ROOM_WAIT_S
        waiting = False
        try:
            while True:
                found = self.room.claim(
                    name, self.nbytes, self.budget, self.min_loaded_s, self.slots
                )
                if found[0] == "ok":
                    self._noted = None  # a fresh entry: written again once loaded
                    break
                if not waiting:  # the scheduler drains the models in the way
                    self.room.wait_for_room(name, time.time())
                    waiting = True
                if canceled.is_set():
                    raise NoRoom(f"canceled while waiting for room on {device}")
                if time.monotonic() > deadline:
                    raise NoRoom(
                        f"no room on {device} for {name} ({self.nbytes / GIB:.2f} GiB of "
                        f"{self.budget / GIB:.2f}) in {ROOM_WAIT_S:.0f} s: its other models "
                        "stayed busy"
                    )
                time.sleep(WATCH_S)
        finally:
            if waiting:
                self.room.stop_waiting()
        started = time.monotonic()
        log.info("loading %s on %s (on demand)", name, device)
        try:
            self.pipeline.load()
            self.pipeline.warmup()
        except BaseException:
            self.room.free()
            raise
        seconds = time.monotonic() - started
        self.loaded, self.parked = True, False
        log.info("loaded %s on %s in %.2fs", name, device, seconds)
        self.tally.add([(MODEL_LOADS, (name, device), 1), (MODEL_LOAD_SECONDS, (name,), seconds)])

    def _unload(self, reason: str) -> bool:
        """Unload the model (or park it, unless the worker stops); True where parked."""
        name, device = self.pipeline.name, self.room.device
        parked = reason != "stopped" and self.pipeline.park()
        if not parked:
            self.pipeline.unload()
        self.loaded, self.parked = False, parked
        free_memory()
        self.room.free()
        log.info("%s %s from %s (%s)", "parked" if parked else "unloaded", name, device, reason)
        if reason != "stopped":
            self.tally.add([(MODEL_UNLOADS, (name, device, reason), 1)])
        return parked

    def _note_use(self) -> None:
        """Write how many jobs the loaded model runs now, when that changes what its
        entry tells (idle, or full: `ModelEntry.takes_more`, and the idle time that
        evictions go by), not at every job's start and end: two round trips a job would
        weigh on an LLM engine's hundreds of requests a second. One writer at a time, each
        with the count as it is when it writes, so the last one written is the latest."""
        try:
            with self._note_lock:
                with self._cv:
                    busy = self._in_flight
                state = (busy == 0, busy >= self.slots)
                if state == self._noted:
                    return
                self.room.mark_use(busy, time.time() if busy == 0 else 0)
                self._noted = state
        except redis.RedisError as exc:
            log.warning("could not note the use of %s: %s", self.pipeline.name, exc)

    # -- the watcher

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            try:
                self._look()
            except redis.RedisError as exc:
                log.warning("residency of %s: %s", self.pipeline.name, exc)

    def _look(self) -> None:
        asked = self.room.eviction_asked()
        if not self.loaded:
            if asked:
                self.room.refuse_eviction()
            return
        with self._cv:
            busy = self._in_flight > 0
            idle_s = time.monotonic() - self._idle_since
        if not asked and (busy or idle_s < self.idle_unload_s):
            return
        if busy or self._waiting():
            if asked:
                self.room.refuse_eviction()  # asked again once it is idle
            return
        with self._model_lock, self._cv:
            if self._in_flight != 0 or not self.loaded:
                return
            parked = self._unload("evicted" if asked else "idle")
        # A parked model's process (a sleeping engine) goes with the worker: it stays.
        exits = self.pipeline.config.exits_after_unload and not parked
        if exits and self.exit_process is not None:
            log.info("%s unloaded: this worker exits, for a fresh one", self.pipeline.name)
            self._stop.set()
            self.exit_process()

    def _waiting(self) -> int:
        """Jobs waiting in this pipeline's queue. Jobs the scheduler holds are not
        counted: it holds them to let another model of the device have its turn (or
        until a slot frees, which an idle model has)."""
        return self.room.queued(self._queues)


def free_memory() -> None:
    """Give an unloaded model's memory back: the garbage collector, PyTorch's CUDA cache
    where PyTorch is in use, and glibc's free lists to the OS."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def model_bytes(pipeline: Pipeline[Any, Any]) -> int:
    return estimate(pipeline.config, on_gpu=pipeline.config.device != "cpu").bytes


def device_budget(settings: Settings, device: str) -> int:
    """Bytes the models of `device` must fit in (0: no budget)."""
    gib = settings.device_memory_gb.get(device)
    if gib is not None:
        return int(gib * GIB)
    if device == "cpu":
        return 0
    usage = read_usage(device)
    return usage.memory_total_bytes if usage else 0


def residency_for(
    pipeline: Pipeline[Any, Any],
    settings: Settings,
    r: redis.Redis,
    tally: MetricsTally,
    worker: str,
    push_back: Callable[[str], None] | None = None,
    exit_process: Callable[[], None] | None = None,
) -> Resident | OnDemand:
    """The residency of a worker's pipeline (a resident one is loaded already);
    `push_back` puts a job's message back at the front of its queue, `exit_process` ends
    the worker process after an unload (`exit_after_unload`)."""
    config = pipeline.config
    stale_s = STALE_BEATS * settings.lease.heartbeat_s
    room = DeviceRoom(r, settings.host_name, config.device, worker, stale_s)
    nbytes = model_bytes(pipeline)
    if config.residency == "resident":
        return Resident(room, pipeline, nbytes)
    budget = device_budget(settings, config.device)
    return OnDemand(pipeline, room, tally, nbytes, budget, push_back, exit_process)
