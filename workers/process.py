"""A worker process: one pipeline on one device, a Celery consumer of its queue.

Loads the pipeline, starts its engine and the lease keeper, then runs a Celery worker
with the threads pool: its concurrency is how many requests may be in flight here. The
engine's batching knobs and that concurrency are the pipeline's `knobs()`.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import Celery

from cluster.retention import RetentionIndex
from jobs.broker import make_celery, webhook_sender
from jobs.metered import MeteredJobStore
from jobs.metrics import batch_samples
from jobs.models import Job
from jobs.queues import TASK_NAME, queue_name
from jobs.schemas import import_object, schema_for
from jobs.settings import Settings
from pipelines.base import Pipeline
from storage.factory import make_storage
from workers.engine import Engine
from workers.events import EventWriter
from workers.jobfiles import JobFiles
from workers.jobrunner import JobRunner
from workers.leases import LeaseKeeper
from workers.metrics import WorkerMetrics

log = logging.getLogger(__name__)


def worker_name(pipeline: str, instance: int) -> str:
    return f"{pipeline}-{instance}@{socket.gethostname()}.{os.getpid()}"


def build_pipeline(settings: Settings, pipeline_name: str) -> Pipeline[Any, Any]:
    config = settings.pipelines[pipeline_name]
    cls = import_object(config.impl)
    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise TypeError(f"{config.impl} is not a Pipeline")
    pipeline = cls(config, settings)
    pipeline.name = pipeline_name
    return pipeline


def register_task(app: Celery, runner: JobRunner) -> None:
    def run_job(job_id: str) -> str:
        outcome = runner.run(job_id)
        log.info("job %s: %s", job_id, outcome)
        return outcome

    app.task(name=TASK_NAME, acks_late=True, ignore_result=True)(run_job)


def run_worker(settings: Settings, pipeline_name: str, instance: int = 0) -> None:
    """Serve `pipeline_name` until the Celery worker stops (SIGTERM, SIGINT)."""
    name = worker_name(pipeline_name, instance)
    pipeline = build_pipeline(settings, pipeline_name)
    config = pipeline.config
    knobs = pipeline.knobs()
    log.info("worker %s: loading %s (%s)", name, pipeline_name, config.model or config.impl)
    pipeline.load()
    pipeline.warmup()
    app = make_celery(settings)
    store = MeteredJobStore.connect(settings, on_event=webhook_sender(app))
    metrics = WorkerMetrics(store.r, config.device)
    keeper = LeaseKeeper(
        store,
        settings,
        name,
        {"kind": config.kind, "pipeline": pipeline_name, "device": config.device},
    )
    engine = Engine(
        pipeline,
        name=pipeline_name,
        max_batch=knobs.max_batch,
        max_wait_ms=knobs.max_wait_ms,
        runners=knobs.runners,
        observer=lambda name, size, seconds: store.tally.add(batch_samples(name, size, seconds)),
    )
    storage = make_storage(settings)
    index = RetentionIndex(store.r)

    def files_for(job: Job) -> JobFiles:
        return JobFiles(settings, storage, index, owner=job.owner, job_id=job.id)

    schema = schema_for(config.kind, settings)
    events = EventWriter(store, merge=pipeline.merge_partials)
    runner = JobRunner(store, engine, keeper, events, schema, name, files_for)
    register_task(app, runner)
    events.start()
    engine.start()
    keeper.start()
    metrics.start()
    store.tally.start()
    try:
        app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={knobs.concurrency}",
                f"--queues={queue_name(pipeline_name)}",
                f"--hostname={name}",
                f"--loglevel={settings.log_level}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    finally:
        metrics.stop()
        keeper.stop()
        engine.stop()
        events.stop()
        store.tally.stop()
        pipeline.unload()
