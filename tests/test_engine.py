"""The engine: batches by key, max_batch, max_wait_ms, failures, cancel (in process)."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import pytest

from jobs.errors import InputError
from jobs.models import EventType
from jobs.schemas.base import JobInput
from jobs.settings import PipelineConfig, Settings
from pipelines.base import Pipeline, Request
from workers.engine import Engine, Outcome, WorkItem


class Item(JobInput):
    key: str = "a"
    value: int = 0
    fail: bool = False
    reject: str = ""
    """Raise in prepare: `input` an InputError, `bug` a RuntimeError."""
    timing_ms: float | None = None
    """Record it as the request's `ttft_ms`."""
    drop_in_run: bool = False
    """Run checks for cancel first (`drop_if_canceled`) and leaves this one at that."""


class Recorder(Pipeline[Item, Request[Item]]):
    """Records each batch it runs; optionally holds the first batch until released."""

    kind = "test"

    def __init__(self, hold_first: bool = False) -> None:
        super().__init__(PipelineConfig(kind="test", impl="x:y"), Settings())
        self.batches: list[tuple[float, list[int]]] = []
        self.prepared_on: list[str] = []
        self.started = threading.Event()
        """Set as a batch starts running (the runner is busy from then on)."""
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def load(self) -> None:
        pass

    def batch_key(self, request: Item) -> Hashable | None:
        return request.key if request.key != "solo" else None

    def prepare(self, request: Request[Item]) -> Request[Item]:
        self.prepared_on.append(threading.current_thread().name)
        if request.input.reject == "input":
            raise InputError("value", "rejected in prepare")
        if request.input.reject == "bug":
            raise RuntimeError("prepare broke")
        return request

    def run(self, batch: Sequence[Request[Item]]) -> None:
        self.started.set()
        self.release.wait(5)
        self.batches.append((time.monotonic(), [r.input.value for r in batch]))
        if any(r.input.fail for r in batch):
            raise ValueError("bad batch")
        for request in batch:
            if request.input.drop_in_run and request.drop_if_canceled():
                continue
            if request.input.timing_ms is not None:
                request.record_timing("ttft_ms", request.input.timing_ms)
            request.partial({"seen": True})
            request.succeed({"value": request.input.value})


Events = list[tuple[str, EventType, dict[str, Any]]]


@pytest.fixture
def events() -> Events:
    return []


def _sink(events: Events) -> Any:
    def sink(job_id: str, etype: EventType, data: dict[str, Any], output: bool) -> None:
        events.append((job_id, etype, data))

    return sink


@pytest.fixture
def make_engine() -> Iterator[Any]:
    engines: list[Engine] = []

    def make(pipeline: Recorder, **kw: Any) -> Engine:
        engine = Engine(pipeline, name="test", **kw)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def _submit(engine: Engine, events: Events, n: int, key: str = "a", **kw: Any) -> list[WorkItem]:
    return [
        engine.submit(f"j{key}{i}", Item(key=key, value=i, **kw), _sink(events), threading.Event())
        for i in range(n)
    ]


def test_same_key_shares_one_batch(make_engine: Any, events: Events) -> None:
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=8, max_wait_ms=200)
    items = _submit(engine, events, 5)
    outcomes = [item.wait(5) for item in items]
    assert [o.status for o in outcomes if o] == ["succeeded"] * 5
    assert [values for _, values in pipeline.batches] == [[0, 1, 2, 3, 4]]
    assert len([e for e in events if e[1] is EventType.PARTIAL]) == 5


def test_different_keys_never_share_a_batch(make_engine: Any, events: Events) -> None:
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=8, max_wait_ms=50)
    items = _submit(engine, events, 3, key="a") + _submit(engine, events, 3, key="b")
    items += _submit(engine, events, 2, key="solo")
    for item in items:
        item.wait(5)
    batches = sorted(values for _, values in pipeline.batches)
    assert batches == [[0], [0, 1, 2], [0, 1, 2], [1]]


def test_flushes_at_max_batch_without_waiting(make_engine: Any, events: Events) -> None:
    """A full batch runs without its window: a minute here, so the batch that ran (within
    the 30 s each wait allows) did not wait for it, however slow the machine."""
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=4, max_wait_ms=60_000)
    items = _submit(engine, events, 4)
    outcomes = [item.wait(30) for item in items]
    assert [o.status for o in outcomes if o] == ["succeeded"] * 4
    assert [values for _, values in pipeline.batches] == [[0, 1, 2, 3]]


def test_max_wait_ms_is_honoured(make_engine: Any, events: Events) -> None:
    """A lone request waits out its window for mates, then runs on the window's own timer
    (nothing else comes to wake the runner); with no window it waits for nothing."""
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=8, max_wait_ms=300)
    submitted = time.monotonic()
    (item,) = _submit(engine, events, 1)
    assert item.wait(10) is not None
    assert pipeline.batches[0][0] - submitted >= 0.28
    quick_pipeline = Recorder()
    quick = make_engine(quick_pipeline, max_batch=8, max_wait_ms=0)
    waiting = make_engine(Recorder(), max_batch=8, max_wait_ms=60_000)
    (held,) = _submit(waiting, events, 1, key="y")
    (fast,) = _submit(quick, events, 1, key="z")
    assert fast.wait(30) is not None  # while the other engine's minute still holds its own
    assert [values for _, values in quick_pipeline.batches] == [[0]] and not held.done


def test_a_request_after_a_quiet_spell_starts_at_once(make_engine: Any, events: Events) -> None:
    """Low load: a request that comes more than max_wait_ms after the one before starts
    at once; one that follows closely waits for mates as before. The window (2 s) is
    long beside a thread's wake-up, so "at once" is told from "waited" on a busy machine:
    starting at once is running before the window would have ended."""
    window_s = 2.0
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=8, max_wait_ms=window_s * 1000)
    first = _submit(engine, events, 1, key="a")[0]
    assert first.wait(0.3) is None  # nothing came before it: it waits for mates
    assert first.wait(30) is not None
    assert pipeline.batches[-1][0] - first.submitted_at >= window_s - 0.02
    # Its window ran out before it ran: the next request comes after a quiet spell.
    (quiet,) = _submit(engine, events, 1, key="b")
    assert quiet.wait(30) is not None
    assert pipeline.batches[-1][0] - quiet.submitted_at < window_s * 0.75  # at once
    (close,) = _submit(engine, events, 1, key="c")  # right after the one before
    assert close.wait(0.3) is None and len(pipeline.batches) == 2  # it waits for mates


def test_batches_grow_while_the_runner_is_busy(make_engine: Any, events: Events) -> None:
    pipeline = Recorder(hold_first=True)
    engine = make_engine(pipeline, max_batch=3, max_wait_ms=0)
    first = _submit(engine, events, 1)
    assert pipeline.started.wait(5)  # the runner took the first batch and is busy
    rest = [
        engine.submit(f"r{i}", Item(value=10 + i), _sink(events), threading.Event())
        for i in range(5)
    ]
    pipeline.release.set()
    for item in first + rest:
        item.wait(5)
    assert [values for _, values in pipeline.batches] == [[0], [10, 11, 12], [13, 14]]


def test_a_raising_pipeline_fails_its_batch_and_the_engine_goes_on(
    make_engine: Any, events: Events
) -> None:
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=4, max_wait_ms=20)
    bad = _submit(engine, events, 2, key="bad", fail=True)
    for item in bad:
        outcome = item.wait(5)
        assert outcome is not None and outcome.status == "failed"
        assert isinstance(outcome.error, ValueError)
    (good,) = _submit(engine, events, 1, key="good")
    outcome = good.wait(5)
    assert outcome is not None and outcome.status == "succeeded"


def test_a_canceled_request_is_dropped_before_its_batch_runs(
    make_engine: Any, events: Events
) -> None:
    pipeline = Recorder(hold_first=True)
    engine = make_engine(pipeline, max_batch=4, max_wait_ms=0)
    (blocker,) = _submit(engine, events, 1, key="x")
    assert pipeline.started.wait(5)
    cancel = threading.Event()
    dropped = engine.submit("drop", Item(value=7), _sink(events), cancel)
    kept = engine.submit("keep", Item(value=8), _sink(events), threading.Event())
    cancel.set()
    pipeline.release.set()
    outcome = dropped.wait(5)
    assert outcome is not None and outcome.status == "canceled"
    assert kept.wait(5) is not None
    assert [values for _, values in pipeline.batches] == [[0], [8]]
    assert not any(job_id == "drop" for job_id, _, _ in events)
    assert blocker.done


def test_a_failing_prepare_fails_only_its_request(
    make_engine: Any, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=4, max_wait_ms=5000)
    good, bad_input, bug, other = (
        engine.submit(f"p{i}", Item(value=i, reject=reject), _sink(events), threading.Event())
        for i, reject in enumerate(["", "input", "bug", ""])
    )
    outcomes = [item.wait(5) for item in (good, bad_input, bug, other)]
    assert [o.status for o in outcomes if o] == ["succeeded", "failed", "failed", "succeeded"]
    assert isinstance(bad_input.outcome and bad_input.outcome.error, InputError)
    assert isinstance(bug.outcome and bug.outcome.error, RuntimeError)
    assert [values for _, values in pipeline.batches] == [[0, 3]]  # run got the prepared
    assert len(pipeline.prepared_on) == 4
    assert all(name.startswith("engine-test-") for name in pipeline.prepared_on)
    assert {job_id for job_id, _, _ in events} == {"p0", "p3"}
    logged = [r for r in caplog.records if r.name == "workers.engine"]
    assert [r.getMessage() for r in logged] == ["pipeline test: preparing job p2 failed"]
    assert logged[0].exc_info is not None  # a bug is logged with its traceback; bad input not


def test_recorded_timings_reach_the_outcome(make_engine: Any, events: Events) -> None:
    engine = make_engine(Recorder(), max_batch=2, max_wait_ms=5000)
    timed = engine.submit("t", Item(value=1, timing_ms=12.34567), _sink(events), threading.Event())
    plain = engine.submit("p", Item(value=2), _sink(events), threading.Event())
    outcome = timed.wait(5)
    assert outcome is not None and outcome.timings == {"ttft_ms": 12.346}
    untimed = plain.wait(5)
    assert untimed is not None and untimed.timings == {}
    timed.record_timing("e2e_ms", 1.0)  # after the end: ignored
    assert outcome.timings == {"ttft_ms": 12.346}


def test_a_request_canceled_mid_batch_is_dropped_by_the_helper(
    make_engine: Any, events: Events
) -> None:
    pipeline = Recorder(hold_first=True)
    engine = make_engine(pipeline, max_batch=2, max_wait_ms=5000)
    cancel = threading.Event()
    kept = engine.submit("keep", Item(value=1, drop_in_run=True), _sink(events), threading.Event())
    dropped = engine.submit("drop", Item(value=2, drop_in_run=True), _sink(events), cancel)
    assert pipeline.started.wait(5)  # both are in the running batch
    assert not dropped.canceled
    cancel.set()
    assert dropped.canceled
    pipeline.release.set()
    outcome = dropped.wait(5)
    assert outcome is not None and outcome.status == "canceled"
    assert (kept.wait(5) or Outcome("none")).status == "succeeded"
    assert [values for _, values in pipeline.batches] == [[1, 2]]
    assert [job_id for job_id, _, _ in events] == ["keep"]


def test_an_inline_engine_runs_each_request_on_the_thread_that_submits_it(
    make_engine: Any, events: Events
) -> None:
    """`EngineKnobs.inline` (an LLM engine batches by itself): no runner thread; each
    request runs as a batch of one on its task's thread, counted in `running` meanwhile,
    and a failing one fails alone."""
    pipeline = Recorder()
    engine = make_engine(pipeline, max_batch=8, max_wait_ms=60_000, inline=True)
    seen_running: list[int] = []
    pipeline.started = _Counting(lambda: seen_running.append(engine.running))

    def submit_on(name: str, item: Item) -> WorkItem:
        done: list[WorkItem] = []
        thread = threading.Thread(
            target=lambda: done.append(engine.submit(name, item, _sink(events), threading.Event())),
            name=f"task-{name}",
        )
        thread.start()
        thread.join(10)
        return done[0]

    first = submit_on("j1", Item(value=1))
    second = submit_on("j2", Item(value=2, fail=True))
    assert first.done and second.done  # finished by the time submit returned
    assert first.outcome is not None and first.outcome.status == "succeeded"
    assert second.outcome is not None and second.outcome.status == "failed"
    assert [values for _, values in pipeline.batches] == [[1], [2]]  # never batched together
    assert pipeline.prepared_on == ["task-j1", "task-j2"]
    assert seen_running == [1, 1] and engine.running == 0
    assert not any(t.name.startswith("engine-test") for t in threading.enumerate())


class _Counting(threading.Event):
    """An event whose `set` also calls `hook` (the pipeline sets it as each batch runs)."""

    def __init__(self, hook: Any) -> None:
        super().__init__()
        self.hook = hook

    def set(self) -> None:
        self.hook()
        super().set()
