"""Workers of every model kind stopped with SIGTERM with a job in flight lose nothing
(`workers.shutdown`), on the session's deployment of every kind (`kinds_dep`: the tiny
Stable Diffusion, tiny.en, the Piper voice; the LLM relay's own test is in
tests/test_llm_relay.py, the hand-back's details in tests/test_leases.py): each job either
ends there within the grace, or is handed back and runs once elsewhere, and every one
succeeds with one attempt counted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from typing import Any

import redis

from harness.api_client import Api, new_owner
from harness.audio import spoken
from tuning.deployment import Deployment, Proc, running_on, wait_until
from workers.shutdown import HAND_BACK_WAIT_S, STRAGGLER_WAIT_S

GRACE_S = 1.0
"""`worker.shutdown_grace_s` of the workers stopped here: shorter than their jobs."""
SAID = tuple(f"Sentence number {n} of a long recording, spoken slowly." for n in range(12))


def _long_jobs(api: Api) -> dict[str, dict[str, Any]]:
    """A job of each kind that runs for seconds on its tiny model."""
    wav = spoken(SAID)
    upload = api.http.post("/v1/files", files={"file": ("said.wav", wav, "audio/wav")})
    assert upload.status_code == 201, upload.text
    return {
        "image": {"prompt": "a red cube", "width": 128, "height": 128, "steps": 100},
        "asr": {"audio": upload.json()["key"]},
        "tts": {"text": " ".join(SAID * 3)},
    }


def _restart(
    dep: Deployment, pipelines: Iterable[str], env: dict[str, str] | None = None
) -> dict[str, Proc]:
    """A worker of each of `pipelines`, all started at once and waited for together."""
    workers = {
        pipeline: dep.spawn(f"worker-{pipeline}-{time.monotonic_ns()}", "worker", "--pipeline",
                            pipeline, env=env)
        for pipeline in pipelines
    }  # fmt: skip
    dep.wait_started(list(workers.values()), timeout_s=240)
    return workers


def test_workers_of_every_kind_stopped_with_a_job_in_flight_lose_none(
    kinds_dep: Deployment,
) -> None:
    api = new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"stop{time.monotonic_ns()}")
    store = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    work = _long_jobs(api)
    # The deployment's workers of these pipelines stop first (idle: at once), and workers
    # with a short grace take their place.
    # All at once, then waited for together.
    idle = [p for p in kinds_dep.procs if p.name.startswith(tuple(f"worker-{k}" for k in work))]
    for proc in idle:
        if proc.alive():
            os.kill(proc.process.pid, signal.SIGTERM)
    for proc in idle:
        proc.process.wait(60)
        kinds_dep.procs.remove(proc)
    env = {"MMQ_WORKER__SHUTDOWN_GRACE_S": str(GRACE_S)}
    stopping = _restart(kinds_dep, work, env)
    jobs = {pipeline: api.submit(pipeline, **inp)["id"] for pipeline, inp in work.items()}
    for pipeline, job_id in jobs.items():
        worker = stopping[pipeline]

        def started(w: Proc = worker, j: str = job_id) -> bool:
            return j in running_on(store, w) or api.get(j)["status"] != "queued"

        wait_until(started, worker, timeout_s=120)

    for worker in stopping.values():
        os.kill(worker.process.pid, signal.SIGTERM)
    bound = GRACE_S + HAND_BACK_WAIT_S + STRAGGLER_WAIT_S + 30  # liveness, not a timing
    for worker in stopping.values():
        worker.process.wait(bound)
        assert worker.process.returncode == 0, worker.log()[-3000:]
    ended_there = {p for p, j in jobs.items() if api.get(j)["status"] == "succeeded"}
    for pipeline, job_id in jobs.items():
        job = api.get(job_id)
        if pipeline not in ended_there:  # handed back: queued, the run not counted
            assert (job["status"], job["attempts"]) == ("queued", 0), job

    _restart(kinds_dep, work)  # the deployment's workers again, for the session's other tests
    for pipeline, job_id in jobs.items():
        job = api.wait(job_id, 300)
        assert (job["status"], job["attempts"]) == ("succeeded", 1), (pipeline, job)
