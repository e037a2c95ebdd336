"""A private deployment around a pipeline of known cost, for the benches of scheduling
(`bench.batches`, `bench.fairness`): the tests' `SleepPipeline` as pipeline `work`, each
job sleeping `service_ms`, with `slots` runners on one worker, the API and the reaper
(whose scheduler they measure)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import redis

from tuning.deployment import private_deployment

PIPELINE = """
[pipelines.work]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
max_batch = 1
concurrency = {slots}
runners = {slots}
"""


def job_input(service_ms: int, step_ms: int = 50) -> dict[str, Any]:
    """The input of one `work` job of `service_ms`, in steps of about `step_ms` (where a
    cancel or a preemption stops it)."""
    steps = max(1, service_ms // step_ms)
    return {"model": "work", "steps": steps, "step_ms": service_ms // steps}


def job_body(service_ms: int, step_ms: int = 50) -> dict[str, Any]:
    return {"kind": "sleep", "input": job_input(service_ms, step_ms)}


@contextlib.contextmanager
def sleep_deployment(slots: int, env: dict[str, str]) -> Iterator[tuple[str, redis.Redis]]:
    """(the API's URL, a client of its Redis), with everything stopped after."""
    base = {"MMQ_BATCHES__RELEASE_INTERVAL_S": "0.05", "MMQ_QUEUE__MAX_QUEUED": "100000"}
    config = PIPELINE.format(slots=slots)
    with private_deployment(config, base | env, ["work"], prefix="mmq-sleepwork-") as dep:
        yield dep.base_url, redis.Redis.from_url(dep.redis_url, decode_responses=True)
