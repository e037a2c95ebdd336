"""What the scheduler (`scheduler/`) reads and writes in Redis, and nothing it decides:
each pipeline's slot readings, the devices' model entries and waiting models, fair
share's release of held jobs (`RELEASE_HELD`), batch lines stopped for interactive work,
and the room each pipeline has for submits. The keys are `jobs.keys`'; only this module
and the job store touch them for the scheduler."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import redis

from broker.kombu_redis import PRIORITY_VALUES, priority_list
from broker.queues import queue_name
from jobs import keys
from jobs.device_models import ModelEntry, split_member
from jobstore.codec import text_list, text_map
from jobstore.lua import RELEASE_HELD

PRIORITIES = list(PRIORITY_VALUES)
"""In order: high, normal, low, batch."""
INTERACTIVE = PRIORITIES[:-1]


@dataclass(frozen=True)
class RunningJob:
    job_id: str
    pipeline: str
    priority: str
    started_at: float
    preempt_requested: bool


@dataclass
class SlotReading:
    """One pipeline's live workers and what holds their slots, as Redis has them now."""

    worker_slots: list[int | None]
    """What each live worker runs at once, as it published it (None: not said yet)."""
    queued: list[int]
    """Messages waiting in its queue, per priority of `PRIORITIES` (batch last)."""
    held: list[int]
    """Jobs held by fair share, per priority of `INTERACTIVE`."""
    running: list[RunningJob] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceTurns:
    """One device's models (worker -> entry) and the models waiting for its room (worker
    -> pipeline)."""

    host: str
    device: str
    models: dict[str, ModelEntry]
    waiting: dict[str, str]


class SchedulingStore:
    """The scheduler's reads and writes, on the deployment's Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._release_held = client.register_script(RELEASE_HELD)

    def live_workers(self, since: float) -> list[str]:
        """Workers (`PIPELINE-N@HOST`) whose last heartbeat is at `since` or later."""
        return text_list(self.r.zrangebyscore(keys.WORKERS, since, "+inf"))

    def slot_readings(self, workers: dict[str, list[str]]) -> dict[str, SlotReading]:
        """Per pipeline of `workers` (pipeline -> its live workers): its slot readings, in
        two round trips."""
        running_ids = text_list(self.r.zrange(keys.RUNNING, 0, -1))
        pipe = self.r.pipeline(transaction=False)
        for pipeline, names in workers.items():
            for name in names:
                pipe.hget(keys.worker(name), "slots")
            for priority in PRIORITIES:
                pipe.llen(priority_list(queue_name(pipeline), PRIORITY_VALUES[priority]))
            pipe.hmget(keys.HELD, [f"{pipeline}|{p}" for p in INTERACTIVE])
        for job_id in running_ids:
            pipe.hmget(keys.job(job_id), "pipeline", "priority", "started_at", "preempt_requested")
        found = iter(pipe.execute())
        readings: dict[str, SlotReading] = {}
        for pipeline, names in workers.items():
            slots = [None if (n := next(found)) is None else int(n) for _ in names]
            queued = [int(next(found)) for _ in PRIORITIES]
            held = [max(0, int(n or 0)) for n in next(found)]
            readings[pipeline] = SlotReading(slots, queued, held)
        for job_id, (pipeline, priority, started_at, preempt) in zip(
            running_ids, found, strict=True
        ):
            reading = readings.get(_text(pipeline))
            if reading is not None:
                reading.running.append(
                    RunningJob(job_id, _text(pipeline), _text(priority),
                               float(started_at or 0), _text(preempt) == "1")
                )  # fmt: skip
        return readings

    def device_turns(self) -> list[DeviceTurns]:
        """Every device with model entries: its models and the models waiting for it."""
        devices = [split_member(d) for d in text_list(self.r.smembers(keys.MODEL_DEVICES))]
        if not devices:
            return []
        pipe = self.r.pipeline(transaction=False)
        for host, device in devices:
            pipe.hgetall(keys.device_waiting(host, device))
            pipe.hgetall(keys.device_models(host, device))
        found = iter(pipe.execute())
        turns = []
        for host, device in devices:
            waiting = {w: json.loads(v)["pipeline"] for w, v in text_map(next(found)).items()}
            models = {
                w: ModelEntry.model_validate_json(v) for w, v in text_map(next(found)).items()
            }
            turns.append(DeviceTurns(host, device, models, waiting))
        return turns

    def drop_waiting(self, host: str, device: str, workers: list[str]) -> None:
        """Forget the waits of `workers` (killed while they waited)."""
        if workers:
            self.r.hdel(keys.device_waiting(host, device), *workers)

    def forget_models(self, host: str, device: str, silent: list[str]) -> None:
        """Drop the model entries of those of `silent` the reaper has forgotten (killed
        long ago): a worker's restart must not leave one behind for good."""
        if not silent:
            return
        pipe = self.r.pipeline(transaction=False)
        for worker in silent:
            pipe.zscore(keys.WORKERS, worker)
        forgotten = [w for w, beat in zip(silent, pipe.execute(), strict=True) if beat is None]
        if forgotten:
            self.r.hdel(keys.device_models(host, device), *forgotten)

    def release_held(self, pipeline: str, priority: str, room: int, max_running: int) -> int:
        """Fair share: up to `room` of the pipeline's jobs held at `priority` pushed to its
        queue, by turns between keys (`RELEASE_HELD`); how many were."""
        pushed = self._release_held(
            keys=[keys.holders(pipeline, priority), keys.passes(pipeline, priority),
                  keys.LIMITS, keys.HELD],
            args=[f"{keys.HOLD_PREFIX}{pipeline}|{priority}|", keys.job(""),
                  f"{pipeline}|{priority}", room, keys.USAGE_PREFIX, max_running],
        )  # fmt: skip
        return len(pushed)

    def write_rooms(self, rooms: dict[str, list[int]], newcomers: set[str], ttl_ms: int) -> None:
        """What a submit may push at once, per pipeline and `INTERACTIVE` priority, and
        whether a newcomer's job goes to the front of its queue at once (`newcomers`: the
        pipelines with live workers, not draining; `SUBMIT`), kept `ttl_ms` (past it, with
        no scheduler running, submits push at once)."""
        pipe = self.r.pipeline(transaction=False)
        for pipeline, room in rooms.items():
            pipe.hset(
                keys.room(pipeline),
                mapping={**dict(zip(INTERACTIVE, room, strict=True)),
                         "newcomers": int(pipeline in newcomers)},
            )  # fmt: skip
            pipe.pexpire(keys.room(pipeline), ttl_ms)
        pipe.execute()


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
