"""The bare Celery floor: a no-op task on mmq's Celery configuration (its settings and its
kombu transport, `broker/kombu_redis.py`), nothing else.

The worker (`python -m bench.celery_floor --concurrency N`, Redis from `MMQ_REDIS_URL`)
runs a threads pool like an mmq pipeline worker, on its own queue. With the result
backend off (as in mmq), the task tells the client it ran by an RPUSH to a list named by
the client, which BLPOPs it: one extra Redis command each side, the cheapest notice.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import redis
from celery import Celery

from broker.celery_app import make_celery
from broker.kombu_redis import PRIORITY_VALUES
from jobs.settings import Settings, load_settings

FLOOR_TASK = "bench.floor_noop"
FLOOR_QUEUE = "bench.floor"
REPLY_PREFIX = "bench:floor:reply:"


def new_reply_key() -> str:
    return f"{REPLY_PREFIX}{uuid.uuid4().hex}"


def make_floor_app(settings: Settings) -> Celery:
    """mmq's Celery app with the no-op task registered (for the worker side)."""
    app = make_celery(settings)
    replies = redis.Redis.from_url(settings.redis_url or "")

    @app.task(name=FLOOR_TASK, acks_late=True, ignore_result=True)
    def floor_noop(reply_key: str) -> None:
        replies.rpush(reply_key, b"1")

    return app


class FloorClient:
    """Sends no-op tasks and waits for their notices, each round trip on a pool thread."""

    def __init__(self, settings: Settings, threads: int, timeout_s: float = 30.0) -> None:
        self.app = make_celery(settings)
        self.replies = redis.Redis.from_url(settings.redis_url or "")
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="floor")
        self.timeout_s = timeout_s

    def send(self, reply_key: str) -> None:
        self.app.send_task(
            FLOOR_TASK, args=[reply_key], queue=FLOOR_QUEUE, priority=PRIORITY_VALUES["normal"]
        )

    def wait(self, reply_key: str, timeout_s: float) -> bool:
        """Whether the task that answers on `reply_key` ran within `timeout_s`."""
        return self.replies.blpop([reply_key], timeout=timeout_s) is not None

    def roundtrip(self) -> str | None:
        """Send one task and block until it has run; None, or why not."""
        key = new_reply_key()
        self.send(key)
        return None if self.wait(key, self.timeout_s) else f"no completion in {self.timeout_s:g}s"

    async def call(self) -> str | None:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.roundtrip)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.replies.close()
        self.app.close()


def worker_argv(concurrency: int, loglevel: str) -> list[str]:
    """The same worker flags as an mmq pipeline worker (workers/process.py)."""
    return [
        "worker",
        "--pool=threads",
        f"--concurrency={concurrency}",
        f"--queues={FLOOR_QUEUE}",
        f"--hostname=bench-floor@{socket.gethostname()}.{os.getpid()}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Bare Celery no-op worker (bench floor).")
    parser.add_argument("--concurrency", type=int, default=32, help="threads pool size")
    args = parser.parse_args(argv)
    settings = load_settings()
    if not settings.redis_url:
        raise SystemExit("MMQ_REDIS_URL is not set")
    app = make_floor_app(settings)
    app.worker_main(worker_argv(args.concurrency, settings.log_level))


if __name__ == "__main__":
    main()
