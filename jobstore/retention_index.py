"""What the retention sweep (`cluster.retention`) looks at, in Redis: the uploads and the
jobs' output folders (`keys.UPLOADS`, `keys.ARTIFACTS`), each scored by when the sweep
should next look, the jobs that used each upload (`keys.upload_jobs`), and how long those
jobs' records live on. An entry is written before its file, so a crash leaves at worst an
entry without a file, never a file that nothing will delete. `RetentionIndex` is the
sweep's and the workers'; `AsyncUploads` the API's (uploads, deletes, the jobs that use
an upload)."""

from __future__ import annotations

import time
from typing import Literal

import redis
import redis.asyncio as aredis

from jobs import keys

Index = Literal["uploads", "artifacts"]
_INDEX_KEYS = {"uploads": keys.UPLOADS, "artifacts": keys.ARTIFACTS}


class RetentionIndex:
    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def note_upload(self, key: str, due_at: float) -> None:
        """An upload, looked at from `due_at` on."""
        self.r.zadd(keys.UPLOADS, {key: due_at})

    def note_artifacts(self, folder: str) -> None:
        """Call before writing a job's first output to its `folder` (`storage.base.job_folder`):
        the folder goes with the job's record, whose id is its last part."""
        self.r.zadd(keys.ARTIFACTS, {folder: time.time()}, nx=True)

    def due(self, index: Index, now: float, limit: int) -> list[str]:
        """Up to `limit` entries of `index` due at `now`."""
        found = self.r.zrangebyscore(_INDEX_KEYS[index], "-inf", now, start=0, num=limit)
        return [str(m) for m in found]

    def look_again(self, index: Index, member: str, at: float, *, existing: bool = False) -> None:
        """Look at `member` again at `at` (only if it is still there, with `existing`)."""
        self.r.zadd(_INDEX_KEYS[index], {member: at}, xx=existing)

    def drop(self, index: Index, member: str) -> None:
        self.r.zrem(_INDEX_KEYS[index], member)

    def upload_users(self, key: str) -> list[str]:
        """The jobs that used the upload."""
        return [str(j) for j in self.r.smembers(keys.upload_jobs(key))]

    def forget_upload(self, key: str) -> None:
        self.r.delete(keys.upload_jobs(key))

    def record_lives_ms(self, job_ids: list[str]) -> list[int]:
        """Each job record's time to live (ms): -1 for no expiry, -2 for a record gone."""
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.pttl(keys.job(job_id))
        return [int(ttl) for ttl in pipe.execute()]


class AsyncUploads:
    def __init__(self, client: aredis.Redis) -> None:
        self.r = client

    async def note(self, key: str, due_at: float) -> None:
        """An upload, looked at from `due_at` on (call before writing its file)."""
        await self.r.zadd(keys.UPLOADS, {key: due_at})

    async def drop(self, key: str) -> None:
        """An upload whose file was not written after all."""
        await self.r.zrem(keys.UPLOADS, key)

    async def forget(self, key: str) -> None:
        """An upload deleted: out of the index, with the jobs that used it."""
        pipe = self.r.pipeline(transaction=True)
        pipe.zrem(keys.UPLOADS, key)
        pipe.delete(keys.upload_jobs(key))
        await pipe.execute()

    async def note_users(self, used: list[str], job_id: str) -> None:
        """Let each upload in `used` that is still indexed live as long as the job
        `job_id` does (the sweep keeps an upload while a job that used it lives)."""
        if not used:
            return
        pipe = self.r.pipeline(transaction=False)
        for key in used:
            pipe.zscore(keys.UPLOADS, key)
        scores = await pipe.execute()
        for key, score in zip(used, scores, strict=True):
            if score is not None:
                await self.r.sadd(keys.upload_jobs(key), job_id)
