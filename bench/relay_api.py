"""The API's side of the LLM token path alone: the CPU an API process spends per token
from the events channel to a chat stream's frames, and Redis's, in one process.

    python -m bench.relay_api [--streams 256] [--tokens 128] [--step-ms 20] [--runs 3]
                              [--out FILE.json]

A child process acts as the worker: one `Generation` per job (the LLM pipeline's keeping
of a job's text) and a real `EventWriter` on real Redis, one token per job per engine
step of `--step-ms`, then each job's end. This process acts as the API (on uvloop, as
uvicorn runs it where uvloop is installed): a real `EventHub`, each job followed as
`POST /v1/chat/completions` with `stream: true` follows it (`api.event_feed.follow`, then
`CompletionEvents` making its SSE frames), every frame kept, none written to a socket:
what is measured is the hub, the follow and the framing, not HTTP. Reported per run: this
process's CPU per token (the API's share) and Redis's, per frame sent (a token's frame,
unless the writer joined tokens of one job that waited for a write), and whether every
stream's text arrived whole and once. Run it in two checkouts (the code before a change
and after) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio as aredis
import uvloop

from api.event_feed import follow
from api.hub import EventHub
from api.openai.completion_stream import ChatChunks, CompletionEvents
from bench.common import own_cpu_s, redis_cpu_s, run_meta, write_runs
from host.redis_server import RedisServer
from jobs.models import EventType, Job
from jobs.schemas.llm import LlmInput
from jobs.settings import Settings
from jobstore.store import AsyncJobStore, JobStore, NewEvent
from pipelines.llm.generation import Generation
from workers.event_writer import EventWriter

DEFAULT_OUT = Path("bench/results/relay_api.json")
TOKEN = ' to"ké'
"""Each token's text: a quote to escape and a character outside ASCII."""


class _Request:
    """What `Generation` uses of a pipeline's request."""

    def __init__(self, job_id: str, writer: EventWriter) -> None:
        self.job_id = job_id
        self.input = LlmInput.model_validate({"messages": [{"role": "user", "content": "hi"}]})
        self._writer = writer

    def drop_if_canceled(self) -> bool:
        return False

    def partial(self, data: dict[str, Any]) -> None:
        raise AssertionError("a text-alone generation makes no partial of its own")

    def stream(self, take: Any) -> Any:
        return self._writer.stream(self.job_id, take, None)


def _worker(redis_url: str, job_ids: list[str], tokens: int, step_s: float) -> None:
    """The child: a token per job per step through the worker's writer, then each end."""
    store = JobStore(redis.Redis.from_url(redis_url, decode_responses=True), Settings())
    writer = EventWriter(store)
    writer.start()
    generations = [Generation(_Request(job_id, writer)) for job_id in job_ids]  # type: ignore[arg-type]  # the parts it uses
    next_step = time.monotonic()
    for _ in range(tokens):
        for generation in generations:
            generation.text(TOKEN)
        next_step += step_s
        time.sleep(max(0.0, next_step - time.monotonic()))
    writer.flush()
    ended = {"status": "succeeded"}
    store.append_events([NewEvent(j, EventType.STATUS, ended, False) for j in job_ids])
    writer.stop()


def _job(job_id: str) -> Job:
    now = time.time()
    return Job(
        id=job_id,
        kind="llm",
        pipeline="llm",
        status="running",  # type: ignore[arg-type]  # validated
        owner="o",
        priority="normal",
        input={},
        created_at=now,
        queued_at=now,
    )


async def _follow_all(
    redis_url: str, job_ids: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    hub = EventHub(client)
    await hub.start()
    store = AsyncJobStore(client, Settings())
    frames: dict[str, list[bytes]] = {job_id: [] for job_id in job_ids}

    async def one(job_id: str, queue: Any) -> None:
        to_frames = CompletionEvents(ChatChunks(_job(job_id), "m"), False, {})
        async for batch in follow(store, hub, job_id, None, joined=queue):
            for event in batch or ():
                frames[job_id].extend(to_frames(event))

    queues = [await hub.join(job_id) for job_id in job_ids]
    sync = redis.Redis.from_url(redis_url, decode_responses=True)
    worker = multiprocessing.get_context("spawn").Process(
        target=_worker, args=(redis_url, job_ids, args.tokens, args.step_ms / 1000)
    )
    cpu0, redis0, t0 = own_cpu_s(), redis_cpu_s(sync), time.monotonic()
    worker.start()
    await asyncio.gather(*(one(j, q) for j, q in zip(job_ids, queues, strict=True)))
    wall = time.monotonic() - t0
    cpu, redis_cpu = own_cpu_s() - cpu0, redis_cpu_s(sync) - redis0
    worker.join(30)
    await hub.stop()
    await client.aclose()
    whole = sum(_text(f) == TOKEN * args.tokens for f in frames.values())
    tokens = len(job_ids) * args.tokens
    sent = sum(map(len, frames.values()))
    return {
        "tokens": tokens,
        "streams_whole": whole,
        "frames": sent,
        "api_us_per_frame": round(cpu / sent * 1e6, 2),
        "wall_s": round(wall, 3),
        "api_us_per_token": round(cpu / tokens * 1e6, 2),
        "redis_us_per_token": round(redis_cpu / tokens * 1e6, 2),
    }


def _text(frames: list[bytes]) -> str:
    """A stream's text, from its frames' chunks."""
    text = []
    for frame in frames:
        for line in frame.split(b"\n"):
            if line.startswith(b"data: {"):
                chunk = orjson.loads(line[6:])
                for choice in chunk["choices"]:
                    text.append(choice["delta"].get("content") or "")
    return "".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_api", description=__doc__)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="mmq-relay-api-") as tmp:
        server = RedisServer(Path(tmp), persist=False).start()
        try:
            for run in range(args.runs):
                job_ids = [f"job_a{run}_{i}_{time.monotonic_ns()}" for i in range(args.streams)]
                # uvloop, as uvicorn picks it for the API where it is installed
                with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                    runs.append(runner.run(_follow_all(server.url, job_ids, args)))
        finally:
            server.stop()
    for i, row in enumerate(runs, 1):
        print(
            f"run {i}: API {row['api_us_per_token']} µs and Redis {row['redis_us_per_token']} µs"
            f" of CPU per token ({row['frames']:,} frames: API {row['api_us_per_frame']} µs"
            f" per frame); {row['streams_whole']}/{args.streams} streams whole"
        )
    meta = run_meta(streams=args.streams, tokens=args.tokens, step_ms=args.step_ms)
    write_runs(args.out, meta, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
