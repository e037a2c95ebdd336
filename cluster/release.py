"""The release stage: what waits enters the workers' queues only when its pipeline has
room. Held jobs go by fair share between keys; the lines of batches go behind all
interactive work, and end in exactly one output file.

Every `batches.release_interval_s`, it reads each pipeline's slots (`Slots`: what its live
workers run at once, as each published it (`concurrency`; an LLM worker's engine takes
`max_inflight`), less running jobs and messages waiting in its queue). With
`fairness.enabled`, a submit that finds no room (the `keys.room` this stage wrote, or
another key's job held at its priority or above) is held, and here each pipeline's free
slots go to its held jobs, highest priority first, and within a priority to the key
with the lowest pass (stride scheduling, `RELEASE_HELD`: a release adds 1 / weight to
its key's pass, so a key with one job goes before another key's thousandth). Then, for
each active batch (oldest first):

1. **Collect**: each released line whose job has ended moves, once (`jobstore.batches.COLLECT`),
   to the output file's lines (it succeeded) or the error file's (it did not), in
   OpenAI's shape for the batch's endpoint.
2. **Release**: while the batch is in progress and its window is open, lines are made
   jobs of priority `batch` (`keys.queued_batch`: the 429 bound never counts them),
   as many as their pipeline has room for. A pipeline's room is its live workers'
   slots (less `batches.reserve_slots`) minus the batch lines it
   already holds, and none while an interactive job waits in its queue. The queue
   stays shallow, so what waits can still be reordered, and an interactive job is taken
   before any released line (priority `batch` is kombu's last step). A line's job id is
   fixed (`Line.job_id`) and taking a line off the list is one script that checks it is
   still the first (`RELEASE`): a crash between the job's submit and that script, or two
   release stages at once, makes no second job and loses no line.
   With `batches.preempt`, interactive work that waits for a slot held by a batch line
   stops the line that started last at its next step (`Slots.to_preempt`); its worker
   queues it again (`requeue_preempted`: the run is not counted as an attempt), and the
   freed slot takes the interactive job first.
3. **Finish**: a batch with nothing left to release and nothing in flight writes its two
   files to storage (as OpenAI file objects) and ends: `completed`, or `cancelled` /
   `expired` with every line never released in the error file. A line's job has the
   batch's end as its deadline (`cancel_at_deadline`): past the window, a queued one
   expires and a running one is canceled, so an expired batch ends soon after its window.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

import redis
from celery import Celery

from api.openai import answers
from api.views import job_view
from broker.celery_app import enqueue_webhook, job_message
from cluster.slots import INTERACTIVE, Room, Slots, read_slots
from common.redis_client import FAILOVER_ERRORS
from jobs import keys
from jobs.device_models import ModelEntry, split_member
from jobs.models import Job
from jobs.settings import Settings
from jobs.states import JobStatus
from jobstore.batches import (
    COLLECT,
    SET_IF,
    Batch,
    BatchStatus,
    Line,
    end_event,
    invalid_line,
    output_line,
)
from jobstore.codec import dumps, text_list, text_map
from jobstore.file_objects import FileObject, save_object_sync
from jobstore.lua import RELEASE_HELD
from jobstore.store import JobStore
from storage.base import Storage
from telemetry.metrics import BATCH_LINES_PREEMPTED

log = logging.getLogger(__name__)

RELEASE = """
-- KEYS: waiting lines, in-flight hash; ARGV: the line (JSON), its job id
-- Takes the first waiting line off the list into the in-flight hash, if it is still the
-- first (another release stage may have taken it).
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return 1
"""
NO_LIMIT = 2**31
"""The queued-set bound of a batch line's submit: the release stage is its bound."""
LIVE_BEATS = 3
WATCH_TRIES = 10
MAX_DEPTH_ROUNDS = 64
"""Interactive messages waiting ahead of a pipeline's slots, at most, in rounds of them."""
ROOM_STEPS = 3
"""A pipeline's room is kept this many steps: past that (no release stage runs), submits
push their messages at once."""


class ReleaseStage:
    def __init__(self, store: JobStore, settings: Settings, app: Celery, storage: Storage) -> None:
        self.store = store
        self.r = store.r
        self.settings = settings
        self.app = app
        self.storage = storage
        self._collect = self.r.register_script(COLLECT)
        self._release = self.r.register_script(RELEASE)
        self._set_if = self.r.register_script(SET_IF)
        self._release_held_script = self.r.register_script(RELEASE_HELD)
        self._depth: dict[str, int] = {}
        """Per pipeline: interactive messages allowed to wait ahead (`_release_held`)."""

    def step(self) -> None:
        """One pass: held jobs released by fair share, then the active batches (oldest
        first) collected and fed, then each pipeline's room written for submits."""
        batches = [b for b in map(self._get, text_list(self.r.smembers(keys.BATCHES_ACTIVE))) if b]
        batches.sort(key=lambda b: b.created_at)
        for batch in batches:
            self._collect_ended(batch)
        live = self._live_workers()
        slots = read_slots(self.r, self.settings, live)
        draining = self._draining(set(live))
        # Held jobs are released even with fair share turned off since: none is stranded.
        self._release_held({p: s for p, s in slots.items() if p not in draining})
        if self.settings.batches.preempt:
            self._preempt_lines(slots)
        room = Room(
            {p: s.batch_room(self.settings.batches.reserve_slots) for p, s in slots.items()}
        )
        now = time.time()
        for batch in batches:
            if batch.status.ended:  # it failed at create: only its webhook is left
                self._notify(batch.id)
                self.r.srem(keys.BATCHES_ACTIVE, batch.id)
                continue
            if batch.status is BatchStatus.IN_PROGRESS and now < batch.expires_at:
                self._release_lines(batch, room)
            self._finish_if_done(batch, now)
        if self.settings.fairness.enabled:
            self._write_room(slots, draining)

    # -- collect

    def _collect_ended(self, batch: Batch) -> None:
        """Collect the released lines whose jobs have ended."""
        inflight = text_map(self.r.hgetall(keys.batch_inflight(batch.id)))
        if not inflight:
            return
        pipe = self.r.pipeline(transaction=False)
        for job_id in inflight:
            pipe.hget(keys.job(job_id), "status")
        for (job_id, raw), status in zip(inflight.items(), pipe.execute(), strict=True):
            if status is None or JobStatus(status).terminal:
                self._collect_one(batch, Line.model_validate_json(raw), job_id)

    def _collect_one(self, batch: Batch, line: Line, job_id: str) -> None:
        job = self.store.get(job_id)
        if job is None:  # its record is gone (deleted by hand): the line failed
            text = invalid_line(
                batch.id,
                line.line,
                line.custom_id,
                "job_lost",
                f"line {line.line}: its job is gone",
            )
            target, field = "errors", "failed"
        elif job.status is JobStatus.SUCCEEDED:
            text = output_line(
                batch.id, line.line, line.custom_id, 200, self._answer(batch, line, job), job.id
            )
            target, field = "output", "completed"
        else:
            code, body = self._failure(batch, job)
            text = output_line(batch.id, line.line, line.custom_id, code, body, job.id)
            target, field = "errors", "failed"
        self._collect(
            keys=[
                keys.batch(batch.id),
                keys.batch_inflight(batch.id),
                keys.batch_output(batch.id),
                keys.batch_errors(batch.id),
            ],
            args=[job_id, target, text, field],
        )

    def _answer(self, batch: Batch, line: Line, job: Job) -> dict[str, object]:
        model = str(line.answer.get("model", job.pipeline))
        if batch.endpoint == "/v1/chat/completions":
            return answers.completion(job, model, chat=True)
        if batch.endpoint == "/v1/completions":
            return answers.completion(job, model, chat=False)
        if batch.endpoint == "/v1/embeddings":
            return answers.embeddings(job, model, str(line.answer.get("encoding_format")))
        return job_view(job, self.settings.public_url).model_dump(mode="json")

    def _failure(self, batch: Batch, job: Job) -> tuple[int, dict[str, object]]:
        error = job.error.model_dump() if job.error is not None else None
        code = answers.failure_status(str(job.status), error)
        if batch.endpoint == "/v1/jobs":
            return code, job_view(job, self.settings.public_url).model_dump(mode="json")
        return code, answers.failure_body(str(job.status), error, {})

    # -- release

    def _live_workers(self) -> list[str]:
        live_since = self.store.server_time() - LIVE_BEATS * self.settings.lease.heartbeat_s
        return text_list(self.r.zrangebyscore(keys.WORKERS, live_since, "+inf"))

    def _draining(self, live: set[str]) -> set[str]:
        """On-demand pipelines in the way of a model that waits to load on their device
        (`keys.device_waiting`), loaded for their `min_loaded_s`: fed nothing new, so
        that they finish their queue, go idle and make room (`workers.residency`)."""
        devices = [split_member(d) for d in text_list(self.r.smembers(keys.MODEL_DEVICES))]
        if not devices:
            return set()
        pipe = self.r.pipeline(transaction=False)
        for host, device in devices:
            pipe.hgetall(keys.device_waiting(host, device))
            pipe.hgetall(keys.device_models(host, device))
        found = iter(pipe.execute())
        now = time.time()
        draining: set[str] = set()
        for host, device in devices:
            waiting, models = text_map(next(found)), text_map(next(found))
            gone = [w for w in waiting if w not in live]  # killed while it waited
            if gone:
                self.r.hdel(keys.device_waiting(host, device), *gone)
            waiters = {json.loads(v)["pipeline"] for w, v in waiting.items() if w in live}
            self._forget_models_of_forgotten_workers(
                host, device, [w for w in models if w not in live]
            )
            if not waiters:
                continue
            for worker, raw in models.items():
                entry = ModelEntry.model_validate_json(raw)
                config = self.settings.pipelines.get(entry.pipeline)
                if (
                    config is not None
                    and worker in live
                    and not entry.resident
                    and entry.pipeline not in waiters
                    and now - entry.loaded_at >= config.min_loaded_s
                ):
                    draining.add(entry.pipeline)
        return draining

    def _forget_models_of_forgotten_workers(
        self, host: str, device: str, silent: list[str]
    ) -> None:
        """Drop the model entries of workers the reaper forgot (killed long ago): a
        worker's restart must not leave one behind for good."""
        if not silent:
            return
        pipe = self.r.pipeline(transaction=False)
        for worker in silent:
            pipe.zscore(keys.WORKERS, worker)
        forgotten = [w for w, beat in zip(silent, pipe.execute(), strict=True) if beat is None]
        if forgotten:
            self.r.hdel(keys.device_models(host, device), *forgotten)

    def _release_held(self, slots: dict[str, Slots]) -> None:
        """Fair share: each pipeline's free slots go to its held jobs, highest priority
        first, and within a priority to the key whose turn it is (`RELEASE_HELD`).

        How many may wait in the queue ahead adapts to the jobs' length: it doubles when
        the queue ran dry and slots idled between two steps while jobs were held (short
        jobs: the workers would wait for the next step), and halves back toward half a
        round of the slots when at least half of it, and that floor, was still waiting a
        step later (long jobs: a key whose turn comes waits behind less). Half a round,
        not one: at a whole round a newcomer's p99 wait was about 2x a job
        (`bench.fairness`), and at one message per worker the slots idled between steps
        and the burst lost up to 15 % of its throughput."""
        for pipeline, slot in slots.items():
            depth = self._depth.get(pipeline, slot.total)
            floor = max(slot.ahead, slot.total // 2)
            idle = slot.running < slot.total
            if slot.held_total > 0 and slot.interactive_queued == 0 and idle:
                depth = min(MAX_DEPTH_ROUNDS * slot.total, 2 * depth)
            elif slot.interactive_queued >= max(floor, depth // 2) and depth > floor:
                depth = max(floor, depth // 2)
            self._depth[pipeline] = slot.depth = depth
            for level, priority in enumerate(INTERACTIVE):
                if slot.held[level] <= 0:
                    continue
                if slot.interactive_room(level) <= 0:
                    break
                pushed = self._release_held_script(
                    keys=[
                        keys.holders(pipeline, priority),
                        keys.passes(pipeline, priority),
                        keys.LIMITS,
                        keys.HELD,
                    ],
                    args=[
                        f"{keys.HOLD_PREFIX}{pipeline}|{priority}|",
                        keys.job(""),
                        f"{pipeline}|{priority}",
                        slot.interactive_room(level),
                        keys.USAGE_PREFIX,
                        self.settings.quotas.max_running,
                    ],
                )
                slot.queued[level] += len(pushed)
                slot.held[level] -= len(pushed)

    def _preempt_lines(self, slots: dict[str, Slots]) -> None:
        """`batches.preempt`: interactive work that waits for a slot held by a batch line
        stops the line that started last, at its next step (`Slots.to_preempt`); its
        worker queues it again."""
        for pipeline, slot in slots.items():
            stopped = sum(map(self.store.request_preempt, slot.to_preempt()))
            if stopped:
                log.info("%s: %d batch lines stopped for interactive work", pipeline, stopped)
                self.store.tally.add([(BATCH_LINES_PREEMPTED, (pipeline,), stopped)])

    def _write_room(self, slots: dict[str, Slots], draining: set[str]) -> None:
        """What a submit may still push at once, per pipeline, for a few steps; a
        pipeline without live workers, or draining for another model's turn, has none
        (its jobs are held until one comes, or until its turn)."""
        ttl_ms = int(ROOM_STEPS * self.settings.batches.release_interval_s * 1000) + 100
        pipe = self.r.pipeline(transaction=False)
        for pipeline in self.settings.enabled_pipelines:
            slot = None if pipeline in draining else slots.get(pipeline)
            pipe.hset(
                keys.room(pipeline),
                mapping={p: slot.submit_room(i) if slot else 0 for i, p in enumerate(INTERACTIVE)},
            )
            pipe.pexpire(keys.room(pipeline), ttl_ms)
        pipe.execute()

    def _release_lines(self, batch: Batch, room: Room) -> None:
        lines_key = keys.batch_lines(batch.id)
        while True:
            raw = self.r.lindex(lines_key, 0)
            if raw is None:
                return
            line = Line.model_validate_json(str(raw))
            if not room.take(line.pipeline):
                return  # in file order: a line waits for its own pipeline's room
            job = self._job(batch, line)
            self.store.submit(job, job_message(self.app, job), NO_LIMIT)
            self._release(keys=[lines_key, keys.batch_inflight(batch.id)], args=[raw, job.id])

    def _job(self, batch: Batch, line: Line) -> Job:
        now = time.time()
        metadata = {**line.job.get("metadata", {}), "batch_id": batch.id}
        metadata["batch_custom_id"] = line.custom_id
        return Job(
            id=line.job_id(batch.id),
            kind=line.job["kind"],
            pipeline=line.pipeline,
            status=JobStatus.QUEUED,
            owner=batch.owner,
            priority="batch",
            input=line.job["input"],
            metadata=metadata,
            created_at=now,
            queued_at=now,
            deadline=batch.expires_at,
            cancel_at_deadline=True,
        )

    # -- finish

    def _finish_if_done(self, batch: Batch, now: float) -> None:
        if self.r.hlen(keys.batch_inflight(batch.id)):
            return
        if batch.status is BatchStatus.CANCELLING:
            end, code = BatchStatus.CANCELLED, "batch_cancelled"
        elif batch.status is BatchStatus.IN_PROGRESS and now >= batch.expires_at:
            end, code = BatchStatus.EXPIRED, "batch_expired"
        elif batch.status in {BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING}:
            if self.r.llen(keys.batch_lines(batch.id)):
                return
            end, code = BatchStatus.COMPLETED, ""
        else:
            return
        if code and not self._never_run(batch, code):
            return  # its waiting lines are not in the error file yet: the next step
        if end is BatchStatus.COMPLETED:
            self._set(batch, [BatchStatus.IN_PROGRESS], status=str(BatchStatus.FINALIZING),
                      finalizing_at=repr(time.time()))  # fmt: skip
        output_id = self._write(batch, keys.batch_output(batch.id), "output")
        error_id = self._write(batch, keys.batch_errors(batch.id), "errors")
        stamp = {
            BatchStatus.COMPLETED: "completed_at",
            BatchStatus.CANCELLED: "cancelled_at",
            BatchStatus.EXPIRED: "expired_at",
        }[end]
        ended = self._set(
            batch,
            [BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING],
            status=str(end),
            output_file_id=output_id,
            error_file_id=error_id,
            **{stamp: repr(time.time())},
        )
        pipe = self.r.pipeline(transaction=True)
        pipe.srem(keys.BATCHES_ACTIVE, batch.id)
        pipe.delete(keys.batch_output(batch.id), keys.batch_errors(batch.id))
        pipe.delete(keys.batch_lines(batch.id), keys.batch_inflight(batch.id))
        pipe.execute()
        if ended:
            log.info("batch %s: %s", batch.id, end)
            self._notify(batch.id)

    def _never_run(self, batch: Batch, code: str) -> bool:
        """Every line still waiting, to the error file (one transaction: a line is moved
        once even if two release stages finish the batch together); False when that
        could not be done this time."""
        lines_key = keys.batch_lines(batch.id)
        why = {"batch_cancelled": "the batch was cancelled", "batch_expired": "the window ended"}
        with self.r.pipeline(transaction=True) as pipe:
            for _ in range(WATCH_TRIES):  # another stage moving them: read again
                try:
                    pipe.watch(lines_key)  # type: ignore[no-untyped-call]  # redis-py: unannotated
                    waiting = map(
                        Line.model_validate_json, text_list(pipe.lrange(lines_key, 0, -1))
                    )
                    errors = [
                        invalid_line(
                            batch.id, w.line, w.custom_id, code, f"line {w.line}: {why[code]}"
                        )
                        for w in waiting
                    ]
                    if not errors:
                        return True
                    pipe.multi()
                    pipe.rpush(keys.batch_errors(batch.id), *errors)
                    pipe.hincrby(keys.batch(batch.id), "failed", len(errors))
                    pipe.delete(lines_key)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        log.warning("batch %s: its waiting lines kept changing; next step", batch.id)
        return False

    def _write(self, batch: Batch, list_key: str, name: str) -> str:
        """The file's lines to storage, as an OpenAI file object; '' when it has none.
        Its id is the batch's own, so that writing it again replaces it."""
        lines = text_list(self.r.lrange(list_key, 0, -1))
        if not lines:
            return ""
        data = ("\n".join(lines) + "\n").encode()
        key = f"{batch.owner}/batches/{batch.id}/{name}.jsonl"
        stored = self.storage.put(key, data, "application/jsonl")
        digest = hashlib.sha256(f"{batch.id}:{name}".encode()).hexdigest()[:24]
        obj = FileObject(
            id=f"file-{digest}",
            owner=batch.owner,
            key=key,
            bytes=stored.size_bytes,
            filename=f"{batch.id}_{name}.jsonl",
            purpose="batch_output",
            created_at=time.time(),
        )
        ttl_s = self.settings.job_ttl_s
        save_object_sync(self.r, obj, ttl_s)
        # Kept as long as a job's record: the retention sweep deletes it after that.
        self.r.zadd(keys.UPLOADS, {key: time.time() + ttl_s})
        return obj.id

    def _notify(self, batch_id: str) -> None:
        """Hand the batch's end to its webhook, if it has one that wants it."""
        batch = self._get(batch_id)
        event = end_event(batch) if batch is not None else None
        if batch is not None and batch.webhook is not None and event is not None:
            enqueue_webhook(self.app, batch.id, batch.webhook.url, event)

    def _get(self, batch_id: str) -> Batch | None:
        fields = text_map(self.r.hgetall(keys.batch(batch_id)))
        if not fields:
            self.r.srem(keys.BATCHES_ACTIVE, batch_id)
            return None
        return Batch.from_fields(fields)

    def _set(self, batch: Batch, sources: list[BatchStatus], **fields: str) -> bool:
        change = dumps({"sources": [str(s) for s in sources], "fields": fields})
        return bool(self._set_if(keys=[keys.batch(batch.id)], args=[change]))

    def run_forever(self, stop: threading.Event) -> None:
        interval_s = self.settings.batches.release_interval_s
        log.info("release stage: every %ss", interval_s)
        while not stop.wait(interval_s):
            try:
                self.step()
            except FAILOVER_ERRORS as exc:  # Redis down or failing over: no traceback
                log.warning("release stage: %s: %s", type(exc).__name__, exc)
            except (redis.RedisError, OSError, ValueError):
                log.exception("release stage: a step failed")


def start_release_stage(
    store: JobStore, settings: Settings, app: Celery, stop: threading.Event
) -> threading.Thread:
    """Run the release stage in a daemon thread until `stop` is set."""
    from storage.factory import make_storage

    stage = ReleaseStage(store, settings, app, make_storage(settings))
    thread = threading.Thread(target=stage.run_forever, args=(stop,), name="release", daemon=True)
    thread.start()
    return thread
