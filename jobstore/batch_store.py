"""Batches in Redis: the record, its indexes, the lines waiting to be released, the lines
in flight (a job each), and the output and error lines gathered until the batch ends.

`AsyncBatchStore` is the API's (create, list, cancel); `BatchStore` the scheduler's
(release lines, collect them, end the batch). Both name the keys and pass the scripts'
arguments through the functions here, once; only they touch a batch's keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import redis
import redis.asyncio as aredis

from jobs import keys
from jobs.states import JobStatus
from jobstore.batch_records import COLLECT, SET_IF, Batch, BatchStatus, Line
from jobstore.codec import dumps, flat_pairs, text_list, text_map
from jobstore.file_objects import FileObject, save_object_sync

RELEASE = """
-- KEYS: waiting lines, in-flight hash; ARGV: the line (JSON), its job id
-- Takes the first waiting line off the list into the in-flight hash, if it is still the
-- first (another scheduler may have taken it).
if redis.call('LINDEX', KEYS[1], 0) ~= ARGV[1] then return 0 end
redis.call('LPOP', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return 1
"""
WATCH_TRIES = 10


def _set_if_args(sources: Sequence[BatchStatus], fields: dict[str, str]) -> str:
    return dumps({"sources": [str(s) for s in sources], "fields": fields})


def _record_ttl_s(batch: Batch, job_ttl_s: int) -> int:
    """A batch's record outlives its window by a job's record time."""
    return job_ttl_s + int(batch.expires_at - time.time())


class BatchStore:
    """The scheduler's side of batches (`scheduler.batch_feed`)."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._collect = client.register_script(COLLECT)
        self._release = client.register_script(RELEASE)
        self._set_if = client.register_script(SET_IF)

    def active(self) -> list[Batch]:
        """The batches the scheduler works on, oldest first (a record that is gone is
        dropped from the set)."""
        found = [b for b in map(self.get, text_list(self.r.smembers(keys.BATCHES_ACTIVE))) if b]
        return sorted(found, key=lambda b: b.created_at)

    def get(self, batch_id: str) -> Batch | None:
        fields = text_map(self.r.hgetall(keys.batch(batch_id)))
        if not fields:
            self.r.srem(keys.BATCHES_ACTIVE, batch_id)
            return None
        return Batch.from_fields(fields)

    def deactivate(self, batch_id: str) -> None:
        self.r.srem(keys.BATCHES_ACTIVE, batch_id)

    def ended_lines(self, batch_id: str) -> list[tuple[str, Line]]:
        """(job id, line) of its lines in flight whose jobs have ended (or are gone)."""
        inflight = text_map(self.r.hgetall(keys.batch_inflight(batch_id)))
        if not inflight:
            return []
        pipe = self.r.pipeline(transaction=False)
        for job_id in inflight:
            pipe.hget(keys.job(job_id), "status")
        ended = []
        for (job_id, raw), status in zip(inflight.items(), pipe.execute(), strict=True):
            if status is None or _terminal(status):
                ended.append((job_id, Line.model_validate_json(raw)))
        return ended

    def collect(self, batch_id: str, job_id: str, text: str, *, succeeded: bool) -> bool:
        """Move the line of `job_id` out of flight to the output (it succeeded) or error
        lines, once; False where another scheduler did."""
        target, count = ("output", "completed") if succeeded else ("errors", "failed")
        names = [keys.batch(batch_id), keys.batch_inflight(batch_id)]
        names += [keys.batch_output(batch_id), keys.batch_errors(batch_id)]
        return bool(self._collect(keys=names, args=[job_id, target, text, count]))

    def first_waiting(self, batch_id: str) -> tuple[str, Line] | None:
        """The next line to release, as stored and parsed."""
        raw = self.r.lindex(keys.batch_lines(batch_id), 0)
        return None if raw is None else (str(raw), Line.model_validate_json(str(raw)))

    def take_line(self, batch_id: str, raw: str, job_id: str) -> bool:
        """The first waiting line (`raw`) into flight as `job_id`'s, if it is still the
        first (`RELEASE`)."""
        return bool(
            self._release(
                keys=[keys.batch_lines(batch_id), keys.batch_inflight(batch_id)],
                args=[raw, job_id],
            )
        )

    def in_flight(self, batch_id: str) -> int:
        return int(self.r.hlen(keys.batch_inflight(batch_id)))

    def waiting(self, batch_id: str) -> int:
        return int(self.r.llen(keys.batch_lines(batch_id)))

    def fail_waiting(self, batch_id: str, error_line: Callable[[Line], str]) -> bool:
        """Every line still waiting to the error lines (`error_line` renders each), in one
        transaction: a line moves once even if two schedulers end the batch together.
        False where they kept changing (the next step tries again)."""
        lines_key = keys.batch_lines(batch_id)
        with self.r.pipeline(transaction=True) as pipe:
            for _ in range(WATCH_TRIES):
                try:
                    pipe.watch(lines_key)  # type: ignore[no-untyped-call]  # redis-py: unannotated
                    waiting = text_list(pipe.lrange(lines_key, 0, -1))
                    errors = [error_line(Line.model_validate_json(raw)) for raw in waiting]
                    if not errors:
                        return True
                    pipe.multi()
                    pipe.rpush(keys.batch_errors(batch_id), *errors)
                    pipe.hincrby(keys.batch(batch_id), "failed", len(errors))
                    pipe.delete(lines_key)
                    pipe.execute()
                    return True
                except redis.WatchError:
                    continue
        return False

    def set_if(self, batch_id: str, sources: Sequence[BatchStatus], **fields: str) -> bool:
        """Write `fields` only while the batch's status is one of `sources`."""
        return bool(self._set_if(keys=[keys.batch(batch_id)], args=[_set_if_args(sources, fields)]))

    def gathered(self, batch_id: str, name: str) -> list[str]:
        """Its `output` or `errors` lines so far."""
        key = keys.batch_output(batch_id) if name == "output" else keys.batch_errors(batch_id)
        return text_list(self.r.lrange(key, 0, -1))

    def save_file(self, obj: FileObject, ttl_s: int) -> None:
        """A file the batch wrote to storage, as an OpenAI file object, kept `ttl_s` (the
        retention sweep deletes its data after that)."""
        save_object_sync(self.r, obj, ttl_s)
        self.r.zadd(keys.UPLOADS, {obj.key: time.time() + ttl_s})

    def close(self, batch_id: str) -> None:
        """An ended batch: off the active set, its working lists gone (its record stays)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.srem(keys.BATCHES_ACTIVE, batch_id)
        pipe.delete(keys.batch_output(batch_id), keys.batch_errors(batch_id))
        pipe.delete(keys.batch_lines(batch_id), keys.batch_inflight(batch_id))
        pipe.execute()


class AsyncBatchStore:
    """The API's side of batches (`api.batch_service`)."""

    def __init__(self, client: aredis.Redis, job_ttl_s: int) -> None:
        self.r = client
        self.job_ttl_s = job_ttl_s

    async def save(self, batch: Batch, *, index: bool = False) -> None:
        """The record (and, for a new batch, its place in its owner's and the admins'
        lists)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.hset(keys.batch(batch.id), items=flat_pairs(batch.fields()))
        pipe.expire(keys.batch(batch.id), _record_ttl_s(batch, self.job_ttl_s))
        if index:
            pipe.zadd(keys.owner_batches(batch.owner), {batch.id: batch.created_at})
            pipe.zadd(keys.BATCHES, {batch.id: batch.created_at})
        await pipe.execute()

    async def add_lines(self, batch_id: str, waiting: list[str], errors: list[str]) -> None:
        """Lines to release (`Line` JSON) and lines already in the error file."""
        if waiting:
            await self.r.rpush(keys.batch_lines(batch_id), *waiting)
        if errors:
            await self.r.rpush(keys.batch_errors(batch_id), *errors)

    async def set_counts(self, batch_id: str, total: int, failed: int) -> None:
        await self.r.hset(keys.batch(batch_id), items=["total", total, "failed", failed])

    async def activate(self, batch_id: str) -> None:
        """The scheduler takes it on (or, for one that failed at create, calls its
        webhook and forgets it)."""
        await self.r.sadd(keys.BATCHES_ACTIVE, batch_id)

    async def get(self, batch_id: str) -> Batch | None:
        fields = text_map(await self.r.hgetall(keys.batch(batch_id)))
        return Batch.from_fields(fields) if fields else None

    async def page(
        self, owner: str | None, limit: int, after: str | None
    ) -> tuple[list[Batch], bool]:
        """`owner`'s batches (None: every owner's), newest first, after the one named
        `after`; and whether there are more."""
        index = keys.owner_batches(owner) if owner is not None else keys.BATCHES
        start = 0
        if after is not None:
            rank = await self.r.zrevrank(index, after)
            start = rank + 1 if isinstance(rank, int) else 0
        ids = text_list(await self.r.zrevrange(index, start, start + limit))
        pipe = self.r.pipeline(transaction=False)
        for batch_id in ids[:limit]:
            pipe.hgetall(keys.batch(batch_id))
        found = [Batch.from_fields(f) for f in map(text_map, await pipe.execute()) if f]
        return found, len(ids) > limit

    async def set_if(
        self, batch_id: str, sources: Sequence[BatchStatus], fields: dict[str, str]
    ) -> bool:
        """Write `fields` only while the batch's status is one of `sources`."""
        change = _set_if_args(sources, fields)
        return bool(await self.r.eval(SET_IF, 1, keys.batch(batch_id), change))


def _terminal(status: bytes | str) -> bool:
    return JobStatus(status.decode() if isinstance(status, bytes) else status).terminal
