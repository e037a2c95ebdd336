"""Long-lived connections end when their key is revoked (issue 65).

A request is authorized once, when it starts; a realtime session or a job's event stream
may then stay open for an hour. Each API process watches the keys of its open connections
with one `HMGET` every `auth.revocation_check_s` (whatever their number), and sets the
`asyncio.Event` of every connection whose key is gone: the connection says why and ends.
The loop runs only while something is watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

import redis.asyncio as aredis

from jobstore.api_keys import keys_present

log = logging.getLogger(__name__)
T = TypeVar("T")

REVOKED_MESSAGE = "the API key of this connection was revoked"


class KeyWatch:
    """The keys that this process's open connections act for, checked together."""

    def __init__(self, client: aredis.Redis, interval_s: float) -> None:
        self._r = client
        self._interval_s = interval_s
        self._watchers: dict[str, list[asyncio.Event]] = {}
        self._loop: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def revoked(self, key_id: str | None) -> AsyncIterator[asyncio.Event]:
        """An event set once the key (by its hash) is revoked; never set for None (no key:
        auth is off, and there is nothing to revoke)."""
        gone = asyncio.Event()
        if key_id is None:
            yield gone
            return
        self._watchers.setdefault(key_id, []).append(gone)
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._check_loop())
        try:
            yield gone
        finally:
            events = self._watchers.get(key_id, [])
            if gone in events:
                events.remove(gone)
            if not events:
                self._watchers.pop(key_id, None)

    async def _check_loop(self) -> None:
        while self._watchers:
            await asyncio.sleep(self._interval_s)
            try:
                await self.check()
            except Exception:  # Redis away for a moment: the next round tries again
                log.warning("cannot check the keys of open connections", exc_info=True)

    async def check(self) -> None:
        """Set the events of every watched key that is no longer stored."""
        watched = list(self._watchers)
        for key_id, present in zip(watched, await keys_present(self._r, watched), strict=True):
            if not present:
                for gone in self._watchers.pop(key_id, []):
                    gone.set()


async def until_revoked(
    items: AsyncIterator[T], revoked: asyncio.Event, farewell: T
) -> AsyncIterator[T]:
    """`items` until they end or `revoked` is set; then `farewell` last. However it ends
    (a client gone cancels it), `items` is closed at once: what they hold (a stream's
    place among its key's) is given back."""
    waiter = asyncio.ensure_future(revoked.wait())
    step: asyncio.Future[T] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(items))
            await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                yield farewell
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield item
    finally:
        waiter.cancel()
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        close = getattr(items, "aclose", None)
        if close is not None:
            await close()


async def while_key_lives(
    watch: KeyWatch, key_id: str | None, frames: AsyncIterator[T], farewell: T
) -> AsyncGenerator[T, None]:
    """A long-lived response's frames until they end, or until the key they act for is
    revoked: then `farewell` last. Without a key (auth off) the frames pass as they are:
    racing each frame against a revocation that cannot come costs a task per frame."""
    if key_id is None:
        try:
            async for frame in frames:
                yield frame
        finally:
            close = getattr(frames, "aclose", None)
            if close is not None:
                await close()
        return
    async with watch.revoked(key_id) as revoked:
        async for frame in until_revoked(frames, revoked, farewell):
            yield frame
