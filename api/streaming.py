"""Following a job for a client: the one place that knows keep-alives, a client that went
away, and canceling the job it left behind.

Every route that follows a job's events (the SSE and websocket routes, the OpenAI routes
that stream, and those that answer once the job has ended) goes through `stream_job` and
supplies only how one event looks on its wire. A `StreamingResponse` notices a client
that went away by itself (it cancels the task iterating the frames); a route that answers
after waiting uses `until_disconnected` for that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
from starlette.requests import Request

from api.event_feed import Batches
from api.key_watch import KeyWatch
from api.service import JobService
from jobs.errors import Conflict, NotFound
from jobs.models import Event

T = TypeVar("T")


async def stream_job(
    service: JobService,
    owner: str,
    job_id: str,
    to_frames: Callable[[Event], Iterable[T]],
    *,
    after: str | None = None,
    keepalive: T | None = None,
    join: Callable[[list[T]], T] | None = None,
    cancel_on_disconnect: bool = False,
    events: Batches | None = None,
    revoked: Revocation[T] | None = None,
) -> AsyncGenerator[T, None]:
    """The frames that `to_frames` makes of each event of the job after `after`, and
    `keepalive` (where given) when the job has been quiet for about `api.keepalive_s`, until the
    terminal status event. With `join` (a byte or text stream), the frames of events that
    arrived together go out as one write. Raises NotFound here, before any frame, unless
    the job is `owner`'s. With `cancel_on_disconnect`, closing the frames (or canceling
    their task) before the end cancels the job: its client went away. `events`: the job's
    events as `JobService.submit_following` gave them, for the job the route just
    submitted (no owner check then, and `after` is not used). `revoked`: the key the
    stream acts for; once it is revoked, the next batch of events or keep-alive (within
    `auth.revocation_check_s` of a stream that flows, `api.keepalive_s` of a quiet one)
    ends the stream with the revocation's frame, as a client gone would (its job canceled
    with `cancel_on_disconnect`). One flag read a batch: no task or wait per event."""
    if events is None:
        events = await service.follow(owner, job_id, after)
    frames = _frames(
        service, owner, job_id, events, to_frames, keepalive, join, cancel_on_disconnect, revoked
    )
    return frames


@dataclass(frozen=True)
class Revocation(Generic[T]):
    """What ends a stream whose key is revoked (`api.key_watch`): the key, and the last
    frame, which says why."""

    watch: KeyWatch
    key_id: str
    farewell: T

    @classmethod
    def of(cls, watch: KeyWatch, key_id: str | None, farewell: T) -> Revocation[T] | None:
        """What ends a stream acting for `key_id`; None without a key (auth off)."""
        return None if key_id is None else cls(watch, key_id, farewell)


async def _frames(
    service: JobService,
    owner: str,
    job_id: str,
    events: Batches,
    to_frames: Callable[[Event], Iterable[T]],
    keepalive: T | None,
    join: Callable[[list[T]], T] | None,
    cancel_on_disconnect: bool,
    revocation: Revocation[T] | None = None,
) -> AsyncGenerator[T, None]:
    ended = False
    async with contextlib.AsyncExitStack() as watched:
        watched.enter_context(service.streams.held())  # left last: after the cancel below
        revoked = None
        if revocation is not None:
            watch = revocation.watch.revoked(revocation.key_id)
            revoked = await watched.enter_async_context(watch)
        try:
            async for batch in events:
                if revoked is not None and revoked.is_set():
                    assert revocation is not None
                    yield revocation.farewell
                    break
                if batch is None:
                    if keepalive is not None:
                        yield keepalive
                    continue
                frames = [frame for event in batch for frame in to_frames(event)]
                if join is not None and len(frames) > 1:
                    yield join(frames)
                else:
                    for frame in frames:
                        yield frame
            else:
                ended = True
        finally:
            # A client that went away cancels this task: shield the clean-up from that.
            with anyio.CancelScope(shield=True):
                await events.aclose()  # leaves the hub at once, not when collected
                if cancel_on_disconnect and not ended:
                    with contextlib.suppress(Conflict, NotFound):
                        await service.cancel(owner, job_id)


async def prepend(first: T | None, rest: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """`first` (unless None), then `rest`, closed with this: for a route that reads the
    first frame before it chooses its answer."""
    try:
        if first is not None:
            yield first
        async for frame in rest:
            yield frame
    finally:
        with anyio.CancelScope(shield=True):
            await rest.aclose()


@contextlib.asynccontextmanager
async def until_disconnected(request: Request) -> AsyncIterator[None]:
    """Run the body until it is done or the client goes away, whichever comes first (the
    body is then canceled). For a route that waits before it answers: nothing else reads
    the connection while it waits, so this listens for `http.disconnect` itself."""
    with anyio.CancelScope() as body:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            body.cancel()

        # Not a task group: that would wrap the body's own errors (404...) in a group.
        watcher = asyncio.create_task(watch())
        try:
            yield
        finally:
            watcher.cancel()
