"""kombu's Redis transport, with one Redis client per channel instead of one per command.

kombu's `Channel.conn_or_acquire` builds a new `redis.Redis` for each synchronous use, and
the acks-late path uses it twice per task: to note the delivered message in `unacked`
(before the task runs) and to remove it (the ack). Building a `redis.Redis` fills its
table of ~170 response callbacks, ~90 us here, which was over a quarter of a worker's CPU
per no-op job, spent on the consumer thread that every task passes through. A client is
safe to share between threads (each command takes a connection from the channel's pool),
so each channel keeps one. Selected by `make_celery` for redis:// and rediss:// URLs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()
        yield shared


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
