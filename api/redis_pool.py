"""The API's Redis connection pool.

redis-py's asyncio connections pack each command in Python, argument by argument (its
synchronous ones use hiredis); the submit script has about twenty arguments. Connections
from this pool pack with hiredis, as redis-py's synchronous client does.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aredis
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

_PACKER = HiredisRespSerializer()


class _HiredisPacking:
    def pack_command(self, *args: Any) -> list[bytes]:
        return _PACKER.pack(*args)


def _packing_with_hiredis(cls: type[Any]) -> type[Any]:
    return type(f"Hiredis{cls.__name__}", (_HiredisPacking, cls), {})


def connection_pool(url: str, **kwargs: Any) -> aredis.BlockingConnectionPool:
    """A blocking pool (a burst of requests waits for a connection instead of failing)
    for `url` (redis://, rediss:// or unix://), its connections packing with hiredis."""
    pool = aredis.BlockingConnectionPool.from_url(url, **kwargs)
    if HIREDIS_AVAILABLE:
        pool.connection_class = _packing_with_hiredis(pool.connection_class)
    return pool
