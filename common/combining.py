"""Group commit: what many threads ask for at once, done in one call.

A worker feeding an LLM engine runs hundreds of jobs on as many threads, and each job's
start, end and acknowledgement is a Redis round trip of its own. `Combiner.call` gathers
the requests that threads make while a call is in flight, and makes them in one call of
`run_many` (one script, one pipeline): the cost of a round trip is paid once per group.

Flat combining, without a thread of its own: the first caller runs its request at once
(nothing waits when nothing else is asked for), and whoever asks meanwhile queues. When a
call ends, its caller hands the lead to the first thread still queued, which takes every
request queued by then (up to `max_group`) in the next call. So a request waits at most
for the call in flight, and the group grows with the load.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Request = TypeVar("Request")
Reply = TypeVar("Reply")

MAX_GROUP = 256
"""Requests made by one call at most."""


class _Pending(Generic[Request, Reply]):
    __slots__ = ("done", "error", "reply", "request", "woken")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.reply: Reply | None = None
        self.error: BaseException | None = None
        self.done = False
        self.woken = threading.Event()
        """Set when its reply is in, or when its thread is to lead the next call."""


class Combiner(Generic[Request, Reply]):
    """Calls of `run_many` (requests -> their replies, in order), each for every request
    queued while the last one ran. `run_many` raising fails each request of its group."""

    def __init__(
        self, run_many: Callable[[Sequence[Request]], Sequence[Reply]], max_group: int = MAX_GROUP
    ) -> None:
        self.run_many = run_many
        self.max_group = max_group
        self._lock = threading.Lock()
        self._queue: list[_Pending[Request, Reply]] = []
        self._leading = False
        self.calls = 0
        """Calls of `run_many` so far (for tests and benchmarks)."""

    def call(self, request: Request) -> Reply:
        """`request`'s reply, made in a call with whatever else is asked meanwhile; raises
        what `run_many` raised for its group."""
        mine: _Pending[Request, Reply] = _Pending(request)
        with self._lock:
            self._queue.append(mine)
            lead = not self._leading
            self._leading = True
        if not lead:
            mine.woken.wait()
            lead = not mine.done  # woken to lead the next call, not with its reply
        if lead:
            while not mine.done:  # its own request is among the first `max_group` queued
                with self._lock:
                    group = self._queue[: self.max_group]
                    del self._queue[: self.max_group]
                self._run(group)
            with self._lock:  # the lead passes to the first thread still queued
                if self._queue:
                    self._queue[0].woken.set()
                else:
                    self._leading = False
        if mine.error is not None:
            raise mine.error
        return mine.reply  # type: ignore[return-value]  # done without an error: set

    def _run(self, group: list[_Pending[Request, Reply]]) -> None:
        self.calls += 1
        try:
            replies = self.run_many([p.request for p in group])
            if len(replies) != len(group):
                raise RuntimeError(f"{len(replies)} replies to {len(group)} requests")
        except BaseException as exc:
            for p in group:
                p.error = exc
        else:
            for p, reply in zip(group, replies, strict=True):
                p.reply = reply
        for p in group:
            p.done = True
            p.woken.set()
