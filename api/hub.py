"""Pub/sub connections of an API process, fanned out to the requests that wait or stream.

Workers publish a line per event on the events channel (one message for the events they
wrote together), and each job's terminal status notice again, as JSON with the job, on the
ends channel (`jobstore.notices`). The hub always listens for
ends (requests that wait for a job's end need nothing else), and for every event only
while some request follows a job's events, plus `events_linger_s` after the last one:
an API that serves waiting requests alone never reads the rest. Idle subscribers cost
a queue, not a Redis connection. After a lost connection, the subscribers of that
channel get `RESYNC` so they re-read from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Protocol, TypeVar

import orjson
import redis.asyncio as aredis
from redis.exceptions import RedisError

from jobs.errors import Unavailable
from jobs.models import Event
from jobstore.notices import Channel, Notice, event_lines, event_of, job_of, subscribe

log = logging.getLogger(__name__)

RESYNC: Notice = {"type": "__resync__"}
"""Put in every queue after the hub lost its connection: re-read from Redis."""
TICK: Notice = {"type": "__tick__"}
"""Put in every follower's queue each half `keepalive_s`: one timer for every stream, where
a timeout around each stream's wait cost a timer per event."""
SUBSCRIBE_TIMEOUT_S = 10.0


T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Inbox(Generic[T]):
    """What the hub hands a follower, taken all at once: `put_nowait` never waits, and
    `take` returns everything put since the last take, waiting for the first. Where an
    `asyncio.Queue` takes a lock-free but long Python path per item on both sides (its
    unfinished count, its `join` event, its waiters' lists), this is an append, and a
    future per wait: a stream's token costs the API a few microseconds less."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[T]:
        """Every item put since the last take, in order (at least one)."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items

    async def get(self) -> T:
        """The next item alone (the rest stay for the next `get` or `take`)."""
        items = await self.take()
        self._items[:0] = items[1:]
        return items[0]


class _Puts(Protocol[T_contra]):
    def put_nowait(self, item: T_contra, /) -> None: ...


Q = TypeVar("Q", bound=_Puts[Any])
Subscribers = dict[str, set[Q]]
"""job id -> the queues of its local subscribers."""
Ends = asyncio.Queue[Notice]
"""What a request waiting for a job's end reads: its end notice, or `RESYNC`."""
Followed = Inbox[Event | Notice]
"""What a request following a job's events reads: each event, `TICK`, or `RESYNC`."""


class _Listener:
    """One pub/sub connection to one channel, reconnecting until closed."""

    def __init__(
        self,
        client: aredis.Redis,
        channel: Channel,
        on_notice: Callable[[str], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self._client = client
        self._channel = channel
        self._on_notice = on_notice
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def open(self) -> None:
        """Listen from now on (a no-op while listening); returns once subscribed."""
        if self._task is None or self._task.done():
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name=f"hub:{self._channel}")
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT_S):
                await self._ready.wait()
        except TimeoutError:
            raise Unavailable(f"cannot subscribe to the {self._channel} channel on Redis") from None

    @property
    def listening(self) -> bool:
        return self._task is not None and not self._task.done()

    def close(self) -> asyncio.Task[None] | None:
        """Stop listening at once (a later `open` starts afresh); returns the task ending."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        return task

    async def _run(self) -> None:
        connected_before = False
        while True:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await subscribe(pubsub, self._channel)
                self._ready.set()
                if connected_before:
                    self._on_reconnect()
                connected_before = True
                async for message in pubsub.listen():
                    try:
                        self._on_notice(message["data"])
                    except Exception:  # one bad notice must not stop the others
                        log.exception("event hub: cannot dispatch a notice on %s", self._channel)
            except (RedisError, OSError):
                log.warning("event hub lost its Redis connection (%s); reconnecting", self._channel)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: unannotated


class EventHub:
    def __init__(
        self, client: aredis.Redis, *, events_linger_s: float = 30.0, keepalive_s: float = 15.0
    ) -> None:
        self._waiters: Subscribers[Ends] = {}
        self._followers: Subscribers[Followed] = {}
        self._ends = _Listener(
            client,
            "ends",
            functools.partial(_dispatch, self._waiters),
            functools.partial(_resync, self._waiters),
        )
        self._events = _Listener(
            client,
            "events",
            functools.partial(_dispatch_events, self._followers),
            functools.partial(_resync, self._followers),
        )
        self._events_linger_s = events_linger_s
        self._events_idle: asyncio.TimerHandle | None = None
        self._keepalive_s = keepalive_s
        self._ticker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._ends.open()
        self._ticker = asyncio.create_task(self._tick(), name="hub:ticks")

    async def stop(self) -> None:
        if self._events_idle is not None:
            self._events_idle.cancel()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
        for task in (ticker, self._events.close(), self._ends.close()):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    @property
    def following(self) -> bool:
        """Whether the hub listens to every event (some request follows a job's events)."""
        return self._events.listening

    async def join(self, job_id: str) -> Followed:
        """A queue of the job's events as they are announced (and `RESYNC` after a lost
        connection), from the moment this returns: for a request that follows them, which
        must `leave` it. A job may be joined before it exists (a route that submits it and
        streams its events), so that nothing it announces comes before the queue."""
        queue: Followed = Inbox()
        self._followers.setdefault(job_id, set()).add(queue)
        if self._events_idle is not None:
            self._events_idle.cancel()
            self._events_idle = None
        try:
            await self._events.open()
        except BaseException:
            self.leave(job_id, queue)
            raise
        return queue

    @contextlib.asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[Followed]:
        """`join` the job's events for the block, and `leave` them after."""
        queue = await self.join(job_id)
        try:
            yield queue
        finally:
            self.leave(job_id, queue)

    def leave(self, job_id: str, queue: Followed) -> None:
        """Stop filling a queue that `join` gave; the hub stops reading every event
        `events_linger_s` after the last follower left."""
        _remove(self._followers, job_id, queue)
        if not self._followers and self._events_idle is None:
            loop = asyncio.get_running_loop()
            self._events_idle = loop.call_later(self._events_linger_s, self._stop_events)

    def subscribe_ends(self, job_id: str) -> contextlib.AbstractAsyncContextManager[Ends]:
        """A queue of the job's terminal status notice (and `RESYNC`), for a request that
        waits for the end: that notice carries the job's fields as `job` unless they are
        large (`lua.NOTICE_JOB_MAX_BYTES`)."""
        return self._wait_for_end(job_id)

    @contextlib.asynccontextmanager
    async def _wait_for_end(self, job_id: str) -> AsyncIterator[Ends]:
        queue: Ends = asyncio.Queue()
        self._waiters.setdefault(job_id, set()).add(queue)
        try:
            yield queue
        finally:
            _remove(self._waiters, job_id, queue)

    async def _tick(self) -> None:
        """`TICK` to every follower each half `keepalive_s` (`api.event_feed.follow`)."""
        while True:
            await asyncio.sleep(self._keepalive_s / 2)
            for subs in self._followers.values():
                for queue in subs:
                    queue.put_nowait(TICK)

    def _stop_events(self) -> None:
        self._events_idle = None
        if not self._followers:
            self._events.close()


def _dispatch(table: Subscribers[Ends], raw: str) -> None:
    """Each notice of a message (one, or a JSON array of those a worker wrote together)
    to the local subscribers of its job."""
    for notice in _notices(raw):
        for queue in table.get(notice["job_id"], ()):
            queue.put_nowait(notice)


def _dispatch_events(table: Subscribers[Followed], raw: str) -> None:
    """Each event of a message of the events channel (`jobstore.notices`: a line per event)
    to the local subscribers of its job, made once whatever its subscribers, its data
    left as the JSON it came as (`Event.data` decodes it where something reads it). A
    line that cannot be read is logged and skipped; the others still go."""
    if raw[:1] in ("{", "["):  # JSON notices: a worker of an mmq before the lines (an upgrade)
        for notice in _notices(raw):
            for queue in table.get(notice["job_id"], ()):
                queue.put_nowait(_legacy_event(notice))
        return
    for line in event_lines(raw):
        try:
            subs = table.get(job_of(line))
            if not subs:
                continue
            event = event_of(line)
        except (ValueError, IndexError):
            log.exception("event hub: cannot read an event's line %r", b" ".join(line)[:200])
            continue
        for queue in subs:
            queue.put_nowait(event)


def _legacy_event(notice: Notice) -> Event:
    return Event(
        id=notice["id"],
        job_id=notice["job_id"],
        type=notice["type"],
        data=notice["data"],
        ts=notice["ts"],
    )


def _notices(raw: str) -> list[Notice]:
    parsed: Notice | list[Notice] = orjson.loads(raw)
    return parsed if isinstance(parsed, list) else [parsed]


def _remove(table: Subscribers[Q], job_id: str, queue: Q) -> None:
    subs = table.get(job_id)
    if subs is not None:
        subs.discard(queue)
        if not subs:
            del table[job_id]


def _resync(table: Subscribers[Q]) -> None:
    for subs in table.values():
        for queue in subs:
            queue.put_nowait(RESYNC)  # every table takes RESYNC
