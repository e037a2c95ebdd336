"""When a write counts as made: `redis.durability` (memory, fsync, replica).

A submit answers 202 only once its script's writes are confirmed at the level, and a
job's end is confirmed before its worker acknowledges the task or a webhook goes out.
The confirmation runs on the same connection as the script, in the same round trip (a
pipeline of the script and `WAITAOF` / `WAIT`): both commands count the writes of their
own connection only.

- `memory`: nothing waited for.
- `fsync`: `WAITAOF 1 0 timeout`, the primary's append-only file has the write on disk.
  With `appendfsync always` (the embedded server at this level) it is there before the
  script's reply and the wait returns at once; with `everysec` it waits for the next
  fsync (up to a second).
- `replica`: `WAIT replicas timeout`, that many replicas have the write in memory: a
  failover to one of them keeps it.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline
from redis.exceptions import ResponseError

from jobs.errors import NotDurable
from jobs.settings import RedisSettings

RETRY_AFTER_S = 1


class Durability:
    def __init__(self, settings: RedisSettings) -> None:
        self.level = settings.durability
        self.timeout_ms = settings.durability_timeout_ms
        self.replicas = settings.replicas

    @property
    def waits(self) -> bool:
        return self.level != "memory"

    def queue_wait(self, pipe: Pipeline | AsyncPipeline, timeout_ms: int | None = None) -> None:
        """Add the command that waits for this connection's writes to `pipe` (a sync or
        asyncio pipeline; not for `memory`)."""
        timeout = self.timeout_ms if timeout_ms is None else timeout_ms
        if self.level == "fsync":
            pipe.waitaof(1, 0, timeout)
        else:
            pipe.wait(self.replicas, timeout)

    def confirmed(self, reply: Any) -> bool:
        """Whether `reply` (of the command `queue_wait` added) confirms the writes before it;
        a server that refused the wait raises `NotDurable`."""
        if isinstance(reply, ResponseError):
            raise NotDurable(f"redis.durability = {self.level}: the server refused: {reply}")
        if self.level == "fsync":
            return int(reply[0]) >= 1
        return int(reply) >= self.replicas

    def unconfirmed(self, reply: Any, what: str) -> NotDurable | None:
        """None where `reply` confirms the writes of `what`; else the error to raise once
        the caller has done what the writes imply (`not_confirmed`, or the server's
        refusal of the wait)."""
        try:
            return None if self.confirmed(reply) else self.not_confirmed(what)
        except NotDurable as refused:
            return refused

    def not_confirmed(self, what: str) -> NotDurable:
        target = (
            "on the primary's disk" if self.level == "fsync" else (f"on {self.replicas} replica(s)")
        )
        return NotDurable(
            f"{what} was written but not confirmed {target} within {self.timeout_ms} ms "
            f"(redis.durability = {self.level}); it may still run: retry with the same "
            "Idempotency-Key to get it, or check it by id",
            retry_after_s=RETRY_AFTER_S,
        )


def server_problem(level: str, info: dict[str, str | int | float]) -> str | None:
    """Why a server (its `INFO persistence` and `INFO memory`/`CONFIG` fields, as redis-py
    parses them) cannot serve mmq at `level`, or None."""
    policy = str(info.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        return (
            f"Redis evicts keys (maxmemory-policy {policy}): jobs and their queue messages "
            "would vanish under memory pressure; set maxmemory-policy noeviction"
        )
    if level == "fsync" and str(info.get("aof_enabled", "0")) != "1":
        return (
            "redis.durability = fsync needs the append-only file: the server runs with "
            "appendonly no (set appendonly yes, or choose redis.durability = memory)"
        )
    return None
