"""The engine inside a worker process: micro-batching by batch key, events, cancel.

Task threads `submit` requests and wait on them. Runner threads (`runners`, usually 1)
take a batch when one is ready: a group of requests with the same `batch_key` that has
reached `max_batch`, or whose oldest request has waited `max_wait_ms`, or whose oldest
request came more than `max_wait_ms` after the request before it (nothing suggests a batch
mate is on its way, so waiting would only add latency: a lone request at low load starts
at once, and the first request after a quiet spell does not hold up its burst's mates,
which wait and batch). While every runner is busy, groups keep growing, so batches fill
up under load and stay small when idle.
A runner prepares each request of its batch (`Pipeline.prepare`; a failure fails that
request alone), runs the prepared ones, and finishes whatever the pipeline left open.
Each batch has an id; its requests' outcomes carry it with their mates' ids (`BatchInfo`),
which the job's end records.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import orjson

from jobs.errors import InputError
from jobs.models import BATCH_IDS_MAX, BatchInfo, EventType
from jobs.outputs import EventData, JobOutput, PartialData
from jobs.schemas.base import JobInput
from pipelines.base import BackendLost, Canceled, Files, Pipeline, TakePartial, Touch

log = logging.getLogger(__name__)

EventSink = Callable[[str, EventType, EventData, bool], None]
"""(job_id, type, data, is_output) -> None: writes one event of a job."""

StreamSink = Callable[[str, TakePartial], Touch]
"""(job_id, take) -> touch: a job's stream of partial outputs (`EventWriter.stream`)."""

BatchObserver = Callable[[str, int, float], None]
"""(pipeline name, batch size, seconds) -> None: for metrics."""


@dataclass
class Outcome:
    status: str
    """`succeeded`, `failed`, `canceled`, or `lost` (the backend went away: run it again)."""
    output: JobOutput | None = None
    error: BaseException | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """The kind's own timings the pipeline recorded (`Request.record_timing`)."""
    batch: BatchInfo | None = None
    """The batch it ran in."""


@dataclass(eq=False)
class WorkItem:
    """One request in the engine; implements `pipelines.base.Request`."""

    job_id: str
    input: JobInput
    sink: EventSink
    key: Hashable
    cancel_event: threading.Event = field(default_factory=threading.Event)
    job_files: Files | None = None
    streams: StreamSink | None = None
    """Where `stream` goes: the worker's event writer; without it, each `touch` emits
    what `take` gives at once."""
    submitted_at: float = field(default_factory=time.monotonic)
    submitted_s: float = field(default_factory=time.time)
    """When it came (unix seconds), for its trace (`telemetry.tracing`)."""
    batch_started_s: float | None = None
    """When its batch began to run (unix seconds)."""
    finished_s: float | None = None
    """When it finished here (unix seconds)."""
    eager: bool = False
    """It came more than `max_wait_ms` after the request before it: it waits for no mates."""
    batch: BatchInfo | None = None
    """The batch it runs in, once a runner took it."""
    outcome: Outcome | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _finished: threading.Event = field(default_factory=threading.Event)
    _emit_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    @property
    def files(self) -> Files:
        if self.job_files is None:
            raise RuntimeError("this worker has no storage for job files")
        return self.job_files

    @property
    def canceled(self) -> bool:
        return self.cancel_event.is_set()

    def drop_if_canceled(self) -> bool:
        if self.cancel_event.is_set():
            self.drop_canceled()
            return True
        return False

    def partial(self, data: PartialData) -> None:
        self._emit(EventType.PARTIAL, data)

    def stream(self, take: TakePartial) -> Touch:
        if self.streams is not None:
            return self.streams(self.job_id, take)

        def touch() -> None:
            taken = take()
            if taken is not None:
                self._emit(EventType.PARTIAL, orjson.loads(taken[0]))

        return touch

    def progress(self, step: int, total: int, **extra: Any) -> None:
        self._emit(EventType.PROGRESS, {"step": step, "total": total, **extra})

    def record_timing(self, name: str, ms: float) -> None:
        with self._emit_lock:
            if self.outcome is None:
                self.timings[name] = round(ms, 3)

    def succeed(self, output: JobOutput) -> None:
        self._finish(Outcome("succeeded", output=output))

    def fail(self, error: BaseException) -> None:
        """Failed; or canceled, where its cancel came first (a download it stopped)."""
        self._finish(Outcome("canceled" if self.canceled else "failed", error=error))

    def drop_canceled(self) -> None:
        self._finish(Outcome("canceled"))

    def give_back(self, error: BaseException) -> None:
        """Not finished here: the job goes back to the queue (see `BackendLost`)."""
        self._finish(Outcome("lost", error=error))

    def wait(self, timeout_s: float | None = None) -> Outcome | None:
        self._finished.wait(timeout_s)
        return self.outcome

    def _emit(self, etype: EventType, data: EventData) -> None:
        with self._emit_lock:
            if self.outcome is None:
                self.sink(self.job_id, etype, data, True)

    def _finish(self, outcome: Outcome) -> None:
        with self._emit_lock:
            if self.outcome is not None:
                return
            outcome.timings = dict(self.timings)
            outcome.batch = self.batch
            self.finished_s = time.time()
            self.outcome = outcome
        self._finished.set()


class Engine:
    """Forms batches for one pipeline and runs them on `runners` threads."""

    def __init__(
        self,
        pipeline: Pipeline[Any, Any],
        *,
        name: str,
        max_batch: int = 1,
        max_wait_ms: float = 0.0,
        runners: int = 1,
        observer: BatchObserver | None = None,
        inline: bool = False,
    ) -> None:
        if max_batch < 1 or runners < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and runners must be >= 1, max_wait_ms >= 0")
        self.pipeline = pipeline
        self.name = name
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.observer = observer
        self.inline = inline
        """Each request runs on the thread that submits it (`EngineKnobs.inline`)."""
        self._groups: dict[Hashable, list[WorkItem]] = {}
        self._cv = threading.Condition()
        self._stopping = False
        self._solo = itertools.count()
        self._last_submit: float | None = None
        self._running = 0
        self._threads = [
            threading.Thread(target=self._runner, name=f"engine-{name}-{i}", daemon=True)
            for i in range(0 if inline else runners)
        ]

    @property
    def running(self) -> int:
        """Requests in the batches that runners run now (the current batch size, summed
        over runners), for the worker's heartbeat."""
        return self._running

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout_s)

    def submit(
        self,
        job_id: str,
        request: JobInput,
        sink: EventSink,
        cancel: threading.Event,
        files: Files | None = None,
        streams: StreamSink | None = None,
    ) -> WorkItem:
        key = self.pipeline.batch_key(request)
        if key is None:
            key = ("__solo__", next(self._solo))
        item = WorkItem(
            job_id=job_id,
            input=request,
            sink=sink,
            key=key,
            cancel_event=cancel,
            job_files=files,
            streams=streams,
        )
        if self.inline:
            with self._cv:
                self._running += 1
            self._run_counted([item])
            return item
        with self._cv:
            last, self._last_submit = self._last_submit, item.submitted_at
            item.eager = last is not None and item.submitted_at - last > self.max_wait_s
            self._groups.setdefault(key, []).append(item)
            self._cv.notify()
        return item

    # -- runner side ---------------------------------------------------------------

    def _runner(self) -> None:
        while True:
            with self._cv:
                batch = self._take_batch_locked()
                while batch is None:
                    if self._stopping:
                        return
                    self._cv.wait(self._next_wait_locked())
                    batch = self._take_batch_locked()
                self._running += len(batch)
            self._run_counted(batch)

    def _run_counted(self, batch: list[WorkItem]) -> None:
        """`run_batch` for a batch already counted in `running`, which it leaves after."""
        try:
            self.run_batch(batch)
        finally:
            with self._cv:
                self._running -= len(batch)

    def _take_batch_locked(self) -> list[WorkItem] | None:
        """The ready group whose oldest request has waited longest, at most max_batch."""
        now = time.monotonic()
        ready: tuple[float, Hashable] | None = None
        for key, group in list(self._groups.items()):
            group[:] = [item for item in group if not item.drop_if_canceled()]
            if not group:
                del self._groups[key]
                continue
            oldest = group[0].submitted_at
            waits_for_none = group[0].eager or (isinstance(key, tuple) and key[:1] == ("__solo__",))
            full = len(group) >= self.max_batch
            if (waits_for_none or full or now - oldest >= self.max_wait_s) and (
                ready is None or oldest < ready[0]
            ):
                ready = (oldest, key)
        if ready is None:
            return None
        group = self._groups[ready[1]]
        batch, rest = group[: self.max_batch], group[self.max_batch :]
        if rest:
            self._groups[ready[1]] = rest
        else:
            del self._groups[ready[1]]
        return batch

    def _next_wait_locked(self) -> float | None:
        if not self._groups:
            return None
        oldest = min(group[0].submitted_at for group in self._groups.values())
        return max(0.0, oldest + self.max_wait_s - time.monotonic()) + 0.0005

    def run_batch(self, batch: list[WorkItem]) -> None:
        """Prepare and run one batch on this thread, and finish what the pipeline left
        open (the runners call it; tests hand it exact batches)."""
        started = time.monotonic()
        info = BatchInfo(
            id=uuid.uuid4().hex[:16],
            size=len(batch),
            job_ids=[item.job_id for item in batch[:BATCH_IDS_MAX]],
        )
        began = time.time()
        for item in batch:
            item.batch = info
            item.batch_started_s = began
        prepared = [ready for item in batch for ready in self._prepare(item)]
        error: BaseException | None = None
        try:
            if prepared:
                self.pipeline.run(prepared)
        except Canceled:
            pass
        except BackendLost as exc:
            log.warning(
                "pipeline %s lost its backend in a batch of %d: %s", self.name, len(batch), exc
            )
            for item in batch:
                if not item.drop_if_canceled():
                    item.give_back(exc)
        except InputError as exc:  # bad input found while running: no traceback to log
            log.info("pipeline %s: %s in a batch of %d", self.name, exc, len(batch))
            error = exc
        except Exception as exc:  # a failing pipeline fails its batch; the worker lives on
            log.exception("pipeline %s failed a batch of %d", self.name, len(batch))
            error = exc
        for item in batch:
            if not item.done and not item.drop_if_canceled():
                item.fail(error or RuntimeError("the pipeline returned no result"))
        if self.observer is not None:
            self.observer(self.name, len(batch), time.monotonic() - started)

    def _prepare(self, item: WorkItem) -> list[Any]:
        """[the prepared request], or [] where it ended: canceled, or its prepare failed
        (only this request fails; its batch mates go on)."""
        if item.drop_if_canceled():
            return []
        try:
            ready = self.pipeline.prepare(item)
        except InputError as exc:
            item.fail(exc)
            return []
        except Exception as exc:
            log.exception("pipeline %s: preparing job %s failed", self.name, item.job_id)
            item.fail(exc)
            return []
        return [] if item.done else [ready]
