"""One job's life on a worker: take the lease, run it on the engine, record the end.

A task for a job that has ended, is canceled, or whose lease another worker holds is
dropped without running. Only the holder of the lease can record the result, so a job
never ends twice with two different results.

A worker that is stopping (`workers.shutdown`) closes its runner: it starts no job more,
and the jobs it holds are handed back (`operations.hand_back`) by their runs, or, where a
run does not stop in time, by the stopping thread under the run's lease.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from pydantic import ValidationError

from broker.kombu_redis import TaskMessage
from jobs.errors import InputError, NotDurable
from jobs.models import EventType, Job
from jobs.outputs import EventData, JobOutput, Loading
from jobs.schemas import validation_error_field
from jobs.schemas.base import JobInput
from jobs.wire import JobError
from jobstore import operations, quotas
from jobstore.changes import Lease, Transition, TransitionResult
from jobstore.codec import dumps, job_from_fields
from jobstore.group_commit import GroupCommit
from jobstore.store import JobStore, NewEvent
from jobstore.store_base import Done
from pipelines.base import Files, TakePartial, Touch
from telemetry import tracing
from workers.engine import Engine, EventSink, Outcome, WorkItem
from workers.event_writer import EventWriter
from workers.leases import Held, LeaseKeeper
from workers.residency import Residency, Resident

log = logging.getLogger(__name__)

STOPPING = "refused:stopping"
"""What `JobRunner.run` answers once closed: the caller puts the message back."""


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        engine: Engine,
        keeper: LeaseKeeper,
        events: EventWriter,
        schema: type[JobInput],
        worker_name: str,
        files_for: Callable[[Job, threading.Event], Files] | None = None,
        residency: Residency | None = None,
        message_for: Callable[[Job], TaskMessage] | None = None,
    ) -> None:
        self.files_for = files_for
        self.message_for = message_for
        """The task message that queues a job again (a preempted batch line)."""
        self.residency = residency
        self.store = store
        self.starts = GroupCommit(store)
        """The starts of this runner's jobs, made in groups (one script call each)."""
        self.ends = GroupCommit(store)
        """Their ends (and requeues), in groups too: a start never waits for an end's
        confirmation at `redis.durability`."""
        self.engine = engine
        self.keeper = keeper
        self.events = events
        self.schema = schema
        self.worker_name = worker_name
        self.kind = engine.pipeline.config.kind
        self._lock = threading.Lock()
        self._closed = False
        self._starting = 0
        """Runs between the closed check and their end (held ones included)."""
        self._running: dict[str, tuple[Job, Held]] = {}
        self._prestarted: dict[str, tuple[Lease, Done[TransitionResult]]] = {}
        """Jobs started with their intake (`prestart`) whose runs have not taken them up."""

    def prestart(self, job_ids: Sequence[str]) -> None:
        """Start these jobs in one script call: the jobs of one intake (the messages one
        read of the queue took), on the consumer's thread, before their tasks run. Each run
        then takes its job's start up instead of making its own. Only for a runner that
        runs every job it is handed (`prestarts`); a run that finds no start of its job
        here (a message outside an intake, the second message of a job) makes its own."""
        with self._lock:
            if self._closed:
                return
            fresh = [j for j in dict.fromkeys(job_ids) if j not in self._prestarted]
        if not fresh:
            return
        leases = [self.keeper.new_lease() for _ in fresh]
        changes = [
            operations.start(job_id, self.kind, lease, self.worker_name)
            for job_id, lease in zip(fresh, leases, strict=True)
        ]
        dones = self.store.apply_many(changes)
        with self._lock:
            for job_id, lease, done in zip(fresh, leases, dones, strict=True):
                self._prestarted[job_id] = (lease, done)

    @property
    def prestarts(self) -> bool:
        """Whether its jobs may be started with their intake: a run here never gives its
        job to another worker before it starts (models on demand may: `Residency.defer`)."""
        return self.residency is None or isinstance(self.residency, Resident)

    def run(self, job_id: str) -> str:
        """Run one job; returns what happened (for logs): ran, dropped:<why>, deferred
        (given back for a worker whose model is warm), handed-back (started with its
        intake as this runner closed: queued again).

        The script that takes the lease also checks the status and returns the job as it
        is after the change: one round trip before the engine gets the request, or none
        where it was started with its intake (`prestart`)."""
        if self.residency is not None and self.residency.defer(job_id):
            return "deferred"
        with self._lock:
            prestarted = self._prestarted.pop(job_id, None)
            closed = self._closed
            if not closed:
                self._starting += 1
        if closed:
            return self._hand_back_prestarted(prestarted) if prestarted else STOPPING
        try:
            return self._start_and_run(job_id, prestarted)
        finally:
            with self._lock:
                self._starting -= 1
                self._running.pop(job_id, None)

    def _hand_back_prestarted(self, prestarted: tuple[Lease, Done[TransitionResult]]) -> str:
        """A job started with its intake whose run came after the runner closed: queued
        again under its lease (its message is the new one the hand-back pushes)."""
        lease, done = prestarted
        started = done.result()
        if not started.ok:
            return STOPPING  # not started here: its message goes back as it is
        self._hand_back(job_from_fields(started.read_back), lease)
        return "handed-back"

    def _start_and_run(
        self, job_id: str, prestarted: tuple[Lease, Done[TransitionResult]] | None
    ) -> str:
        if prestarted is not None:
            lease, done = prestarted
            started = done.result()
        else:
            lease = self.keeper.new_lease()
            change = operations.start(job_id, self.kind, lease, self.worker_name)
            started = self.starts.apply(change)
        if not started.ok:
            if started.reason == "canceled":
                self._end_canceled_in_queue(job_id)
            elif started.reason == "expired":  # its deadline passed in the queue
                self._apply_end(operations.expire_by_id(job_id, self.kind))
            return f"dropped:{started.status if started.reason == 'status' else started.reason}"
        job = job_from_fields(started.read_back)
        # The script refused a job whose cancel was requested before; a request from
        # now on reaches `held.cancel` through the keeper (notice, or its heartbeat).
        held = self.keeper.hold(job_id, lease)
        with self._lock:
            self._running[job_id] = (job, held)
        try:
            if job.traceparent and tracing.enabled():
                self._run_traced(job, held)
            else:
                self._run_held(job, held)
        finally:
            self.keeper.release(job_id)
        return "ran"

    def _run_traced(self, job: Job, held: Held) -> None:
        """`_run_held` with the job's spans: its wait in the queue, and this run."""
        attributes: tracing.Attributes = {
            "mmq.job_id": job.id,
            "mmq.pipeline": job.pipeline,
            "mmq.kind": job.kind,
            "mmq.attempt": job.attempts,
            "mmq.worker": self.worker_name,
            "mmq.device": self.engine.pipeline.config.device,
        }
        started = job.started_at or time.time()
        tracing.record("mmq.queue", job.queued_at, started, attributes, parent=job.traceparent)
        with tracing.span("mmq.run", job.traceparent, attributes) as run:
            outcome = self._run_held(job, held)
            if run is not None:
                run.set_attribute("mmq.status", outcome.status)
                if outcome.batch is not None:
                    run.set_attribute("mmq.batch_size", outcome.batch.size)
                if outcome.status == "failed":
                    tracing.failed(run, str(outcome.error))

    def close(self) -> None:
        """Start no job from now on (`run` answers `STOPPING`)."""
        with self._lock:
            self._closed = True

    def active(self) -> int:
        """Jobs this runner is starting or holds now (or started with their intake, whose
        runs have not come yet)."""
        with self._lock:
            return self._starting + len(self._prestarted)

    def ask_hand_back(self) -> int:
        """Stop every job held here (their engines' work is canceled): each run queues its
        job again instead of ending it. Returns how many were asked."""
        with self._lock:
            held = [entry for _, entry in self._running.values()]
        for entry in held:
            entry.handing_back = True
            entry.cancel.set()
        return len(held)

    def hand_back_now(self) -> int:
        """Queue again, from this thread, every job whose run has not let it go (a pipeline
        that does not stop on cancel): the run's own end, should it come later, is dropped
        (its lease is gone). Returns how many were handed back."""
        with self._lock:
            stuck = list(self._running.values())
        handed = 0
        for job, held in stuck:
            held.handing_back = True
            held.lost.set()
            held.cancel.set()
            self.keeper.release(job.id)  # no more renewals of a lease it gives up
            result = self._hand_back(job, held.lease)
            if result is not None and result.ok:
                handed += 1
        return handed

    def _hand_back(self, job: Job, lease: Lease) -> TransitionResult | None:
        """Queue the job again under the run's lease, not counting the run; refused (the
        job left alone) where the lease is not the run's any more."""
        if self.message_for is None:  # no way to queue it here: the reaper will
            self.store.give_back_lease(job.id, lease)
            return None
        result = self._apply_end(operations.hand_back(job, lease, self.message_for(job)))
        if result is not None and result.ok:
            log.info("job %s: handed back to the queue (worker stopping)", job.id)
        elif result is not None:
            log.info("job %s: not handed back (%s): it ended or moved on", job.id, result.reason)
        return result

    def _end_canceled_in_queue(self, job_id: str) -> None:
        """A job canceled while queued whose end the API has not recorded yet."""
        self._apply_end(operations.cancel_queued_by_id(job_id, self.kind))

    def _run_held(self, job: Job, held: Held) -> Outcome:
        try:
            request = self.schema.from_record(job.input)
        except ValidationError as exc:
            refused = Outcome("failed", error=validation_error_field(exc, "input"))
            self._record(job, held, refused)
            return refused

        token = held.lease.token

        def emit(job_id: str, etype: EventType, data: EventData, output: bool) -> None:
            # The store takes the data as a plain dict: any pipeline's JSON object.
            event = NewEvent(job_id, etype, dict(data), output, job.webhook, lease_token=token)
            self.events.emit(event)

        def stream(job_id: str, take: TakePartial) -> Touch:
            return self.events.stream(job_id, take, job.webhook, token)

        files = self.files_for(job, held.cancel) if self.files_for else None
        load_ms = 0.0
        item: WorkItem | None = None
        loaded_s = time.time()
        try:
            if self.residency is not None:
                load_ms = self._load_for(job, emit, held)
            loaded_s = time.time()
            item = self.engine.submit(job.id, request, emit, held.cancel, files, stream)
            outcome = item.wait()
        except Exception as exc:  # the model did not load, or found no room
            status = "canceled" if held.cancel.is_set() else "failed"
            log.warning("job %s: %s before it ran: %s", job.id, status, exc)
            outcome = Outcome(status, error=exc)
        finally:
            if self.residency is not None:
                self.residency.release()
        assert outcome is not None  # wait() without timeout returns only when finished
        if load_ms:
            outcome.timings["load_ms"] = round(load_ms, 3)
        self.events.flush()  # its outputs are written before its end
        if outcome.status == "succeeded" and outcome.output is not None:
            # Before the end: a client that saw the end and asks again is answered from it.
            self._remember(job, request, outcome.output)
        self._record(job, held, outcome, request)
        if item is not None and tracing.enabled():
            _record_phases(item, loaded_s, load_ms)
        return outcome

    def _load_for(self, job: Job, emit: EventSink, held: Held) -> float:
        """The pipeline's model loaded (on demand); the milliseconds the job waited."""
        assert self.residency is not None
        loading: Loading = {"status": "running", "loading": self.engine.pipeline.name}
        return self.residency.acquire(
            lambda: emit(job.id, EventType.STATUS, loading, False), held.cancel
        )

    def _remember(self, job: Job, request: JobInput, output: JobOutput) -> None:
        """Keep a deterministic request's answer in the response cache (see
        `JobInput.cache_policy`); the API answers the same request from it."""
        policy = request.cache_policy(self.engine.pipeline.config)
        if policy is not None:
            self.store.remember_answer(job.owner, policy, output)

    def _record(
        self, job: Job, held: Held, outcome: Outcome, request: JobInput | None = None
    ) -> None:
        if held.lost.is_set():
            log.warning("job %s: lease lost, its result here is dropped", job.id)
            return
        held.ended = True
        # The batch it ran in, for the job's page (its mates): written with the end.
        ran_in = {"batch": dumps(outcome.batch.model_dump())} if outcome.batch else {}
        lease = held.lease
        if outcome.status == "succeeded":
            if outcome.timings:  # the kind's own (`jobs.models.Timings`)
                ran_in["extra_timings"] = dumps(outcome.timings)
            change = operations.succeed(job, lease, dict(outcome.output or {}), ran_in)
            cost = request.cost_after(outcome.output or {}) if request is not None else 0
            if cost > 0:  # known only now (ASR: the audio's seconds)
                charge = quotas.charge_after(
                    job.owner, job.kind, cost, self.store.settings.quotas, time.time()
                )
                change = replace(change, charge=charge)
            self._end(job, change)
        elif held.handing_back and not _bad_input(outcome):
            self._hand_back(job, held.lease)  # stopped by its worker's shutdown, whatever it said
        elif outcome.status == "canceled" and self.message_for and self.store.preempted(job.id):
            # A batch line stopped for interactive work (`batches.preempt`), not canceled.
            self._end(job, operations.requeue_preempted(job, lease, self.message_for(job)))
            log.info("job %s: batch line stopped for interactive work; queued again", job.id)
        elif outcome.status == "canceled":
            at_deadline = job.cancel_at_deadline and time.time() >= (job.deadline or math.inf)
            self._end(job, operations.cancel_running(job, lease, ran_in, at_deadline=at_deadline))
        elif outcome.status == "lost":
            log.warning(
                "job %s: backend lost (%s); it goes back to the queue", job.id, outcome.error
            )
            self.store.give_back_lease(job.id, lease)
        else:
            self._end(job, operations.fail(job, lease, _error_info(outcome.error), ran_in))

    def _end(self, job: Job, change: Transition) -> None:
        result = self._apply_end(change)
        if result is not None and not result.ok:
            log.warning("job %s: could not record %s (%s)", job.id, change.target, result.reason)

    def _apply_end(self, change: Transition) -> TransitionResult | None:
        """Apply a change that ends the job (or queues it again); None where Redis made it
        but did not confirm it at `redis.durability` within a lease's time. The store has
        announced it, counted it and handed it on all the same; the worker logs it and
        acknowledges its task: the end is on the primary, and a failover that loses it
        leaves the job as it was there (a run's lease expires, and the reaper takes the
        job back), which the task left unacknowledged would not change."""
        try:
            return self.ends.apply(change)
        except NotDurable as exc:
            log.error("%s", exc.message)
            return None


def _record_phases(item: WorkItem, loaded_s: float, load_ms: float) -> None:
    """The spans of a run's phases (children of the run's span, current here), from the
    times its engine noted: the model's load, the wait for a batch, the batch, and the
    writes after it (its outputs flushed, its end)."""
    if load_ms:
        tracing.record("mmq.model_load", loaded_s - load_ms / 1000, loaded_s)
    began, finished = item.batch_started_s, item.finished_s
    if began is not None:
        tracing.record("mmq.batch_wait", item.submitted_s, began)
        if finished is not None:
            size = item.batch.size if item.batch is not None else 1
            tracing.record("mmq.inference", began, finished, {"mmq.batch_size": size})
    if finished is not None:
        tracing.record("mmq.finish", finished, time.time())


def _bad_input(outcome: Outcome) -> bool:
    """A run that failed on its input: that end stands even while handing back."""
    return outcome.status == "failed" and isinstance(outcome.error, InputError)


def _error_info(error: BaseException | None) -> JobError:
    if isinstance(error, InputError):
        return {"type": "invalid_input", "message": error.message, "field": error.field}
    message = str(error) if error is not None else "unknown error"
    return {"type": "pipeline_error", "message": f"{type(error).__name__}: {message}"}
