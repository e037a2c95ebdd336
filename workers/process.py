"""A worker process: a pipeline on one device, a Celery consumer of its queue; or several
pipelines loaded on demand on one device, sharing the process (one CUDA context).

Loads the pipeline, starts its engine and the lease keeper, then runs a Celery worker
with the threads pool: its concurrency is how many requests may be in flight here. The
engine's batching knobs and that concurrency are the pipeline's `knobs()`. A process
hosting several pipelines runs each as its own worker (name, lease keeper, engine, event
writer, room on the device), consumes all their queues, and hands each message to the
pipeline of its queue; it never exits after an unload, since its other models share
what the process keeps.

The start is recorded in Redis (`jobstore.liveness`) (loading, ready, or failed with the
reason) for `/readyz` and `mmq up`; a start that fails exits with status 1.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task
from celery.backends.base import DisabledBackend
from redis.exceptions import RedisError

from broker import kombu_redis
from broker.celery_app import job_message, make_celery, webhook_sender
from broker.kombu_redis import Envelope, IntakeHook, job_id_of, task_message
from broker.queues import TASK_NAME, queue_name
from common import redis_client
from common.heap import freeze_startup_heap
from jobs.models import Job
from jobs.schemas import import_object, schema_for
from jobs.settings import Settings
from jobstore.liveness import LivenessStore
from jobstore.retention_index import RetentionIndex
from jobstore.store import JobStore
from pipelines.base import Pipeline
from storage.factory import make_storage
from telemetry import tracing
from telemetry.metric_defs import batch_samples
from workers.engine import Engine
from workers.event_writer import EventWriter
from workers.jobfiles import JobFiles
from workers.jobrunner import STOPPING, JobRunner
from workers.leases import LeaseKeeper
from workers.residency import OnDemand, Resident, residency_for
from workers.sampler import Backend, WorkerMetrics, has_readings
from workers.shutdown import Drain

log = logging.getLogger(__name__)

LOADING_TTL_S = 30
"""A `loading` state lives this long unless the loading worker renews it."""
STATE_TTL_S = 24 * 3600
REASON_MAX_CHARS = 1000
FULL_BACKOFF_S = 0.1
"""How long a message of a pipeline whose slots are full waits before it goes back to its
queue (in a process hosting several pipelines): it bounds the rate at which one is taken
and given back while they stay full."""


def worker_name(pipeline: str, instance: int, host: str) -> str:
    return f"{pipeline}-{instance}@{host}.{os.getpid()}"


def build_pipeline(settings: Settings, pipeline_name: str) -> Pipeline[Any, Any]:
    config = settings.pipelines[pipeline_name]
    cls = import_object(config.impl)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise TypeError(f"{config.impl} is not a Pipeline")
    pipeline = cls(config, settings)
    pipeline.name = pipeline_name
    return pipeline


def register_task(app: Celery, hosted: dict[str, Hosted]) -> None:
    """The one task: a job's message goes to the pipeline of the queue it came from.

    A pipeline runs at most its own slots of the thread pool (the sum of its pipelines'):
    a message beyond them goes back to the front of its queue after `FULL_BACKOFF_S`. With
    one pipeline that never happens; with several, one pipeline's jobs waiting for room
    on the device could otherwise hold every thread, while the model in their way cannot
    yield its room because its own queued jobs get no thread to run on."""
    only = next(iter(hosted.values())) if len(hosted) == 1 else None

    def run_job(task: Task, job_id: str) -> str:
        h = only or hosted[task.request.delivery_info["routing_key"]]
        if not h.slots.acquire(blocking=False):
            time.sleep(FULL_BACKOFF_S)
            h.push_back(job_id)
            return "deferred:full"
        try:
            outcome = h.runner.run(job_id)
        finally:
            h.slots.release()
        if outcome == STOPPING:  # taken as the worker began to stop: for another worker
            time.sleep(FULL_BACKOFF_S)
            h.push_back(job_id)
        log.info("job %s: %s", job_id, outcome)
        return outcome

    task = app.task(name=TASK_NAME, bind=True, acks_late=True, ignore_result=True)(run_job)
    # Results are off (`result_backend=None`): one disabled backend, made here. Left to
    # Celery, every pool thread makes its own on its first task (the disabled backend is
    # not marked thread-safe), and the threads of a worker's first burst all scan the
    # installed packages' entry points for backend names at once, before Celery's cache
    # of them is filled: 0.95x of the worker's CPU per token with it, in bench.llm_ceiling's
    # 256 streams (72.3, 72.9 -> 69.2, 69.3 µs, alternating).
    task.backend = DisabledBackend(app)


def intake_starter(hosted: Hosted) -> IntakeHook:
    """The consumer's intake hook of a worker serving one pipeline: the jobs of each
    intake from its queue started in one script call (`JobRunner.prestart`)."""
    queue = queue_name(hosted.pipeline.name)

    def start_intake(source: str, messages: Sequence[Envelope]) -> None:
        if source != queue:
            return
        job_ids = [job_id for job_id in map(job_id_of, messages) if job_id is not None]
        if job_ids:
            hosted.runner.prestart(job_ids)

    return start_intake


class StartState:
    """This worker's start of its pipeline, in Redis (`LivenessStore.record_start`). Best
    effort: a Redis that does not answer yet never keeps a worker from starting."""

    def __init__(self, settings: Settings, pipeline: str, worker: str) -> None:
        self.pipeline = pipeline
        self.worker = worker
        url = settings.redis_url
        self.store = LivenessStore(redis_client.connect(url)) if url else None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._renew = threading.Thread(target=self._keep_alive, name="start-state", daemon=True)

    def loading(self) -> None:
        self._write({"state": "loading"}, LOADING_TTL_S)
        self._renew.start()

    def ready(self) -> None:
        self._write({"state": "ready"}, STATE_TTL_S, drop="reason")

    def failed(self, reason: str) -> None:
        self._write({"state": "failed", "reason": reason}, STATE_TTL_S)

    def _keep_alive(self) -> None:
        while not self._done.wait(LOADING_TTL_S / 3):
            with self._lock:
                if not self._done.is_set():
                    self._send(lambda store: store.keep_start(self.pipeline, LOADING_TTL_S))

    def _write(self, fields: dict[str, str], ttl_s: int, drop: str = "") -> None:
        mapping = {**fields, "worker": self.worker, "pid": str(os.getpid()), "at": str(time.time())}
        with self._lock:
            if fields["state"] != "loading":
                self._done.set()
            self._send(lambda store: store.record_start(self.pipeline, mapping, ttl_s, drop))

    def _send(self, call: Callable[[LivenessStore], None]) -> None:
        if self.store is None:
            return
        try:
            call(self.store)
        except (RedisError, OSError) as exc:
            log.warning("could not record the start of %s: %s", self.worker, exc)


def start_failure(exc: BaseException) -> tuple[str, bool]:
    """(The reason a start failed, whether the exception explains itself): an error with
    a `summary` (an engine that did not start) says why in a few lines; anything else is
    a bug or a missing part, whose traceback is worth the log."""
    summary = getattr(exc, "summary", None)
    if isinstance(summary, str):
        return summary[:REASON_MAX_CHARS], True
    return f"failed to start: {type(exc).__name__}: {exc}"[:REASON_MAX_CHARS], False


def start_or_exit(settings: Settings, pipeline_name: str, name: str) -> Pipeline[Any, Any]:
    """Build, load and warm the pipeline up (unless it is loaded on demand), recording the
    start in Redis; on failure record why and exit with status 1."""
    state = StartState(settings, pipeline_name, name)
    state.loading()
    try:
        pipeline = build_pipeline(settings, pipeline_name)
        config = pipeline.config
        if config.residency == "on_demand":
            log.info("worker %s: %s loads on demand", name, pipeline_name)
            state.ready()
            return pipeline
        log.info("worker %s: loading %s (%s)", name, pipeline_name, config.model or config.impl)
        pipeline.load()
        pipeline.warmup()
    except Exception as exc:
        reason, explained = start_failure(exc)
        state.failed(reason)
        log.error(
            "worker %s: pipeline %s failed to start: %s",
            name, pipeline_name, reason, exc_info=not explained,
        )  # fmt: skip
        raise SystemExit(1) from None
    state.ready()
    return pipeline


@dataclass
class Hosted:
    """One pipeline a worker process serves, with the parts that run it."""

    pipeline: Pipeline[Any, Any]
    engine: Engine
    keeper: LeaseKeeper
    events: EventWriter
    residency: Resident | OnDemand
    runner: JobRunner
    push_back: Callable[[str], None]
    """Puts a job's message back at the front of its queue."""
    concurrency: int
    """Its slots: the requests it runs at once (`knobs().concurrency`)."""

    def __post_init__(self) -> None:
        self.slots = threading.Semaphore(self.concurrency)

    def start(self) -> None:
        self.events.start()
        self.engine.start()
        self.keeper.start()
        self.residency.start()

    def stop(self) -> None:
        self.keeper.stop()
        self.engine.stop()
        self.events.stop()
        self.residency.stop()
        if self.pipeline.config.residency == "resident":
            self.pipeline.unload()


def check_shared(settings: Settings, pipelines: Sequence[str]) -> str | None:
    """Why these pipelines cannot share one process (None: they can): several only when
    each is loaded on demand and all are on one device."""
    if len(pipelines) < 2:
        return None
    if len(set(pipelines)) != len(pipelines):
        return "a pipeline is named twice"
    configs = {name: settings.pipelines[name] for name in pipelines}
    resident = [name for name, c in configs.items() if c.residency != "on_demand"]
    if resident:
        return f"only on-demand pipelines share a process; resident: {', '.join(resident)}"
    if len({c.device for c in configs.values()}) > 1:
        return "pipelines that share a process must be on one device"
    return None


def run_worker(settings: Settings, pipelines: Sequence[str], instance: int = 0) -> None:
    """Serve `pipelines` (one, or several on-demand ones of a device) until the Celery
    worker stops (SIGTERM, SIGINT: `workers.shutdown.Drain` finishes or hands back the jobs
    held here within `worker.shutdown_grace_s`)."""
    if (why := check_shared(settings, pipelines)) is not None:
        raise ValueError(why)
    names = {p: worker_name(p, instance, settings.host_name) for p in pipelines}
    tracing.setup(settings.tracing, "worker")
    built = [start_or_exit(settings, p, names[p]) for p in pipelines]
    app = make_celery(settings)
    if len(built) > 1:
        # The pipelines' queues take turns: in mmq's order ("priority") the first queue's
        # messages, given back while its slots are full, would be taken before any other.
        options = {**app.conf.broker_transport_options, "queue_order_strategy": "round_robin"}
        app.conf.broker_transport_options = options
    store = JobStore.connect(settings, on_event=webhook_sender(app), metered=True)
    backends = [Backend(names[p.name], p.name, p.readings) for p in built if has_readings(p)]
    metrics = WorkerMetrics(
        store.r,
        built[0].config.device,
        host=settings.host_name,
        interval_s=settings.metrics_flush_s,
        backends=backends,
    )

    def exit_process() -> None:
        """A warm shutdown, as on SIGTERM: the worker ends, its supervisor starts another."""
        os.kill(os.getpid(), signal.SIGTERM)

    # A process hosting several models keeps its CUDA context for the others: it never
    # exits after one of them unloads.
    exits = exit_process if len(built) == 1 else None
    storage = make_storage(settings)
    index = RetentionIndex(store.r)

    def files_for(job: Job, cancel: threading.Event) -> JobFiles:
        return JobFiles(settings, storage, index, owner=job.owner, job_id=job.id, cancel=cancel)

    hosted = [
        host(settings, app, store, p, names[p.name], instance, files_for, exits) for p in built
    ]
    register_task(app, {queue_name(h.pipeline.name): h for h in hosted})
    if len(hosted) == 1 and hosted[0].runner.prestarts:
        kombu_redis.on_intake(intake_starter(hosted[0]))
    drain = Drain([h.runner for h in hosted], settings.worker.shutdown_grace_s)
    drain.install()
    for h in hosted:
        h.start()
    metrics.start()
    store.tally.start()
    freeze_startup_heap()
    try:
        app.worker_main(
            [
                "--quiet",  # Celery's option, before the command: no banner
                "worker",
                "--pool=threads",
                f"--concurrency={sum(h.concurrency for h in hosted)}",
                f"--queues={','.join(queue_name(p) for p in pipelines)}",
                f"--hostname={'+'.join(names.values())}",
                f"--loglevel={settings.log_level}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    finally:
        drain.exited()
        metrics.stop()
        for h in hosted:
            h.stop()
        store.tally.stop()


def host(
    settings: Settings,
    app: Celery,
    store: JobStore,
    pipeline: Pipeline[Any, Any],
    name: str,
    instance: int,
    files_for: Callable[[Job, threading.Event], JobFiles],
    exit_process: Callable[[], None] | None,
) -> Hosted:
    """The parts that serve one pipeline in this process, as worker `name`."""
    config = pipeline.config
    knobs = pipeline.knobs()
    engine = Engine(
        pipeline,
        name=pipeline.name,
        max_batch=knobs.max_batch,
        max_wait_ms=knobs.max_wait_ms,
        runners=knobs.runners,
        observer=lambda name, size, seconds: store.tally.add(batch_samples(name, size, seconds)),
        inline=knobs.inline,
    )
    info = {
        "kind": config.kind,
        "pipeline": pipeline.name,
        "device": config.device,
        "instance": str(instance),
        "slots": str(knobs.concurrency),
    }
    keeper = LeaseKeeper(store, settings, name, info, batch_size=lambda: engine.running)
    schema = schema_for(config.kind, settings)
    events = EventWriter(store, merge=pipeline.merge_partials)

    def push_back(job_id: str) -> None:
        """The job's message again, at the front of its queue (taken next)."""
        priority = store.priority_of(job_id)
        store.push_front(task_message(app, job_id, queue_name(pipeline.name), priority))

    residency = residency_for(
        pipeline, settings, store.r, store.tally, name, push_back, exit_process
    )
    runner = JobRunner(
        store, engine, keeper, events, schema, name, files_for, residency,
        message_for=lambda job: job_message(app, job),
    )  # fmt: skip
    return Hosted(pipeline, engine, keeper, events, residency, runner, push_back, knobs.concurrency)
