"""The cap on job event streams one key holds open at once in an API process
(`api.max_streams_per_key`).

A follow of `/v1/jobs/{id}` (SSE or websocket) is a connection, a task and a follower of
the hub for as long as the client likes, and, unlike a streamed completion, it creates no
job that the queue and the key's quotas would count: one key could otherwise hold any
number of them. Over the cap a follow gets 429 with Retry-After.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from jobs.errors import QueueFull

T = TypeVar("T")
RETRY_AFTER_S = 5


class TooManyStreams(QueueFull):
    code = "too_many_streams"


class FollowLimit:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        """0: no cap."""
        self.open: Counter[str] = Counter()

    async def follow(
        self, owner: str, start: Callable[[], Awaitable[AsyncGenerator[T, None]]]
    ) -> AsyncGenerator[T, None]:
        """The frames `start` gives, counted as one of `owner`'s streams until they are
        closed (or, never iterated, collected). Raises TooManyStreams, before `start`,
        when `owner` holds the cap already."""
        release = self._take(owner)
        try:
            frames = await start()
        except BaseException:
            release()
            raise
        held = _released_after(frames, release)
        weakref.finalize(held, release)  # a response that never iterated its frames
        return held

    def _take(self, owner: str) -> Callable[[], None]:
        if self.limit and self.open[owner] >= self.limit:
            raise TooManyStreams(
                f"this key holds {self.open[owner]} job event streams open here, the most "
                "it may (api.max_streams_per_key); close one first",
                RETRY_AFTER_S,
            )
        self.open[owner] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.open[owner] -= 1
            if self.open[owner] <= 0:
                del self.open[owner]

        return release


async def _released_after(
    frames: AsyncGenerator[T, None], release: Callable[[], None]
) -> AsyncGenerator[T, None]:
    try:
        async for frame in frames:
            yield frame
    finally:
        release()
        await frames.aclose()
