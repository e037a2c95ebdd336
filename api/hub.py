"""One pub/sub connection per API process, fanned out to the requests that wait or stream.

Workers publish a notice per event on `keys.EVENTS_CHANNEL`; the hub hands each notice to
the local subscribers of that job. Idle subscribers cost a queue, not a Redis connection.
After a lost connection, every subscriber gets `RESYNC` so it re-reads from the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aredis
from redis.exceptions import RedisError

from jobs import keys
from jobs.states import TERMINAL

log = logging.getLogger(__name__)

RESYNC: dict[str, Any] = {"type": "__resync__"}
_JOB_ID = '"job_id":"'


def _job_id_of(raw: str) -> str:
    """The job id of a notice without parsing it: most notices have no local subscriber."""
    start = raw.find(_JOB_ID)
    if start < 0:
        return ""
    start += len(_JOB_ID)
    return raw[start : raw.find('"', start)]


_NOT_ENDS = ('"data":{"status":"queued"', '"data":{"status":"running"')


def cannot_end(raw: str) -> bool:
    """Whether a notice is surely not a terminal status event, without parsing it. Safe
    because a quote inside a JSON string is escaped: `"type":"status"` appears literally
    only as a key of the notice or of a nested object, and a status notice's data starts
    with its status (the scripts in `jobs/lua.py` write them)."""
    return '"type":"status"' not in raw or any(mark in raw for mark in _NOT_ENDS)


def ends(notice: dict[str, Any]) -> bool:
    """Whether a notice is the job's terminal status event."""
    data = notice.get("data") or {}
    return notice.get("type") == "status" and data.get("status") in TERMINAL


Subscribers = dict[asyncio.Queue[dict[str, Any]], bool]
"""A job's local subscribers: queue -> whether it wants the terminal notice only."""


class EventHub:
    def __init__(self, client: aredis.Redis) -> None:
        self._client = client
        self._subscribers: dict[str, Subscribers] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-hub")
        await asyncio.wait_for(self._ready.wait(), timeout=10)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def subscriber_count(self) -> int:
        return sum(len(s) for s in self._subscribers.values())

    @contextlib.asynccontextmanager
    async def subscribe(
        self, job_id: str, *, ends_only: bool = False
    ) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        """A queue of the job's notices; with `ends_only`, of its terminal status notice
        (and `RESYNC`) alone, for a request that waits for the end: that notice carries
        the job's fields as `job` unless they are large (`lua.NOTICE_JOB_MAX_BYTES`)."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subscribers.setdefault(job_id, {})[queue] = ends_only
        try:
            yield queue
        finally:
            subs = self._subscribers.get(job_id)
            if subs is not None:
                subs.pop(queue, None)
                if not subs:
                    del self._subscribers[job_id]

    async def _run(self) -> None:
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.EVENTS_CHANNEL)
                self._ready.set()
                self._broadcast_resync()
                async for message in pubsub.listen():
                    self._dispatch(message["data"])
            except (RedisError, OSError):
                log.warning("event hub lost its Redis connection; reconnecting")
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()

    def _dispatch(self, raw: str) -> None:
        queues = self._subscribers.get(_job_id_of(raw))
        if not queues or (all(queues.values()) and cannot_end(raw)):
            return
        event = json.loads(raw)
        job = event.pop("job", None)  # carried by an end notice, for `ends_only` alone
        final = ends(event)
        for queue, ends_only in queues.items():
            if not ends_only:
                queue.put_nowait(event)
            elif final:
                queue.put_nowait(event if job is None else {**event, "job": job})

    def _broadcast_resync(self) -> None:
        for subs in self._subscribers.values():
            for queue in subs:
                queue.put_nowait(RESYNC)
