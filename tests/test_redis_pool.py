"""The API's Redis pool: connections that pack commands with hiredis, byte for byte as
redis-py's own asyncio packer does, against a real Redis."""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis
from redis.asyncio.connection import Connection

from api.redis_pool import connection_pool

ARGS: tuple[str | bytes | int | float, ...] = (
    "EVALSHA",
    "ab12",
    2,
    "k1",
    b"k2",
    "é ünïcode",
    1.5,
    -7,
    b"\x00\xff",
)


def test_commands_are_packed_as_redis_py_packs_them(redis_url: str) -> None:
    pool = connection_pool(redis_url, decode_responses=True)
    ours = pool.make_connection()
    stock = Connection(decode_responses=True)
    assert b"".join(ours.pack_command(*ARGS)) == b"".join(stock.pack_command(*ARGS))
    commands = [("SET", "a", 1), ("CONFIG GET", "maxmemory")]
    assert b"".join(ours.pack_commands(commands)) == b"".join(stock.pack_commands(commands))


def test_the_pool_serves_commands_scripts_pipelines_and_pubsub(redis_url: str) -> None:
    async def main() -> tuple[object, ...]:
        pool = connection_pool(redis_url, decode_responses=True, max_connections=4, timeout=5)
        client = aredis.Redis(connection_pool=pool)
        try:
            await client.set("pool:test", "välue")
            script = client.register_script("return {KEYS[1], ARGV[1], redis.call('GET', KEYS[1])}")
            scripted = await script(keys=["pool:test"], args=["ärg"])
            pipe = client.pipeline(transaction=True)
            pipe.incr("pool:n")
            pipe.incr("pool:n")
            piped = await pipe.execute()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            await pubsub.subscribe("pool:ch")
            await client.publish("pool:ch", "hello")
            message = None
            async with asyncio.timeout(5):
                while message is None:
                    message = await pubsub.get_message(timeout=1)
            await pubsub.aclose()
            await client.delete("pool:test", "pool:n")
            return scripted, piped, message["data"]
        finally:
            await client.aclose()
            await pool.aclose()

    scripted, piped, published = asyncio.run(main())
    assert scripted == ["pool:test", "ärg", "välue"]
    assert piped == [1, 2]
    assert published == "hello"
