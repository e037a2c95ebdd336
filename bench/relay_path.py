"""The LLM relay's token path alone: a synthetic engine, an LLM pipeline's relay
(`engine = "url"`) and its event writer on real Redis, with no API, no Celery and no job
records: the CPU that a worker and Redis spend per token and per stream, in one process.

    python -m bench.relay_path [--streams 256] [--tokens 128] [--step-ms 20]
                               [--stream-interval 1] [--out FILE.json]

`--streams` threads each run one request through `LlmPipeline.run`, as a worker's task
threads do, all at once, each `--tokens` tokens long; the engine makes one token per
sequence per step. Reported: tokens/s, and the CPU of this process (the relay) and of
Redis over the run, per token. Run it in two checkouts (the code before a change and
after) to compare the relay alone, without the API's share or the noise of a whole
deployment.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.common import own_cpu_s, redis_cpu_s, run_meta, write_runs
from common.procs import free_port
from host.redis_server import RedisServer
from jobs.models import EventType
from jobs.schemas.llm import LlmInput
from jobs.settings import PipelineConfig, Settings
from jobstore.store import JobStore, NewEvent
from pipelines.llm.pipeline import LlmPipeline
from workers.engine import WorkItem
from workers.event_writer import EventWriter

DEFAULT_OUT = Path("bench/results/relay_path.json")


def _engine(port: int, step_ms: float, interval: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port)]
    argv += ["--step-ms", str(step_ms), "--stream-interval", str(interval)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the synthetic engine did not start")


def _item(job_id: str, inp: LlmInput, writer: EventWriter) -> WorkItem:
    def sink(job: str, etype: EventType, data: Any, output: bool) -> None:
        writer.emit(NewEvent(job, etype, dict(data), output))

    fields: dict[str, Any] = {"job_id": job_id, "input": inp, "sink": sink, "key": job_id}
    if "streams" in WorkItem.__dataclass_fields__:  # the relay keeps its own text
        fields["streams"] = lambda job, take: writer.stream(job, take, None)
    return WorkItem(**fields)


def run(args: argparse.Namespace, redis_url: str, engine_url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    settings = Settings(redis_url=redis_url)
    store = JobStore(client, settings)
    options = {"engine": "url", "engine_url": engine_url, "max_inflight": args.streams}
    config = PipelineConfig(kind="llm", impl="pipelines.llm:LlmPipeline", options=options)
    pipeline = LlmPipeline(config, settings)
    pipeline.load()
    writer = EventWriter(store, pipeline.merge_partials)
    writer.start()
    inp = LlmInput.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": args.tokens}
    )
    items = [_item(f"job_r{i}_{time.monotonic_ns()}", inp, writer) for i in range(args.streams)]
    threads = [threading.Thread(target=pipeline.run, args=([item],)) for item in items]
    cpu0, redis0, t0 = own_cpu_s(), redis_cpu_s(client), time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.flush()
    wall = time.monotonic() - t0
    cpu, redis_cpu = own_cpu_s() - cpu0, redis_cpu_s(client) - redis0
    writer.stop()
    pipeline.unload()
    failed = [i.job_id for i in items if i.outcome is None or i.outcome.status != "succeeded"]
    tokens = args.streams * args.tokens
    return {
        "tokens": tokens,
        "failed": len(failed),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "relay_us_per_token": round(cpu / tokens * 1e6, 2),
        "redis_us_per_token": round(redis_cpu / tokens * 1e6, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_path", description=__doc__)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--stream-interval", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    port = free_port()
    engine = _engine(port, args.step_ms, args.stream_interval)
    with tempfile.TemporaryDirectory(prefix="mmq-relay-path-") as tmp:
        server = RedisServer(Path(tmp), persist=False).start()
        try:
            runs = [run(args, server.url, f"http://127.0.0.1:{port}") for _ in range(args.runs)]
        finally:
            server.stop()
            engine.terminate()
            engine.wait(10)
    for i, row in enumerate(runs, 1):
        print(
            f"run {i}: {row['tokens_per_s']:,.0f} tokens/s, relay {row['relay_us_per_token']} µs "
            f"and Redis {row['redis_us_per_token']} µs of CPU per token, {row['failed']} failed"
        )
    meta = run_meta(
        streams=args.streams,
        tokens=args.tokens,
        step_ms=args.step_ms,
        stream_interval=args.stream_interval,
    )
    write_runs(args.out, meta, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
