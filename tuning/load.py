"""The one load driver of benches and tunes.

Requests go out in a closed loop over N lanes (`closed_loop`: each lane sends its next
request as soon as its last one came back, so N are in flight until the last ones) or
open loop at set offsets from the start (`open_loop`: Poisson arrivals at a rate where
the offsets are drawn so, or a recording's), and each is timed as its client sees it:

- `timed(call)`: any request, not streamed: send to completion (`RequestResult`);
- `stream_chat`: a chat completion, streamed: when each chunk with text arrived and the
  completion tokens, so TTFT, TPOT and ITL (`Shot`, with vLLM's `benchmarks/serve.py`
  definitions: TPOT is (end to end - TTFT) / (tokens - 1); ITL the gaps between chunks);
- `run_job`: an mmq job, followed over SSE: its first `partial` event and its end (`Trace`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import JsonValue

from common.sse import aparse_lines
from jobs.states import ends_job
from jobs.wire import Event, Job, JobRequest, Timings
from tuning.slo import Sample

T = TypeVar("T")


async def closed_loop(
    one: Callable[[int], Awaitable[T]], requests: int, lanes: int, stop: asyncio.Event | None = None
) -> tuple[list[T], float]:
    """`one(i)` for each of `requests` over `lanes` closed-loop lanes; no lane sends
    another once `stop` is set. Returns the results, in the order they ended, and the
    wall time."""
    todo = iter(range(requests))
    results: list[T] = []

    async def lane() -> None:
        for i in todo:
            if stop is not None and stop.is_set():
                return
            results.append(await one(i))

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(max(1, min(lanes, requests)))))
    return results, time.perf_counter() - started


async def open_loop(
    one: Callable[[int], Awaitable[T]], offsets: Sequence[float], stop: asyncio.Event | None = None
) -> tuple[list[T], float]:
    """`one(i)` at `offsets[i]` seconds from the start, whatever is still running; none is
    sent once `stop` is set. Returns the results, in the order sent, and the wall time."""
    stop = stop or asyncio.Event()
    started = time.perf_counter()
    sent: list[asyncio.Future[T]] = []
    for i, offset in enumerate(offsets):
        delay = started + offset - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        if stop.is_set():
            break
        sent.append(asyncio.ensure_future(one(i)))
    results = await asyncio.gather(*sent)
    return results, time.perf_counter() - started


Call = Callable[[], Awaitable[str | None]]
"""One request: returns None on success or a short error description."""


@dataclass
class RequestResult:
    """One request: whether it succeeded and how long it took, send to completion."""

    ok: bool
    latency_s: float
    error: str = ""


async def timed(call: Call) -> RequestResult:
    """Run `call`, timing it; an exception becomes a failed result, never a raise."""
    start = time.perf_counter()
    try:
        error = await call()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    return RequestResult(ok=error is None, latency_s=time.perf_counter() - start, error=error or "")


@dataclass
class Shot:
    """One streamed request."""

    ok: bool = False
    error: str = ""
    start: float = 0.0
    chunks: list[float] = field(default_factory=list)
    """perf_counter() of each chunk that carried text."""
    end: float = 0.0
    tokens: int = 0
    """Completion tokens (from the usage chunk; else the chunks counted)."""

    @property
    def ttft_s(self) -> float:
        return (self.chunks[0] if self.chunks else self.end) - self.start

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def tpot_s(self) -> float | None:
        if self.tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.tokens - 1)

    @property
    def itls_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]

    def sample(self) -> Sample:
        """Its metrics in ms, as an SLO reads them."""
        seconds = {"e2e": self.e2e_s, "ttft": self.ttft_s, "tpot": self.tpot_s}
        metrics = {k: None if v is None else v * 1000 for k, v in seconds.items()}
        return Sample(self.ok, metrics, self.error or None, self.tokens)


async def stream_chat(
    http: httpx.AsyncClient, base: str, model: str, text: str, max_tokens: int, **extra: Any
) -> Shot:
    """One streamed chat completion at `base` (mmq's API or an engine); never raises."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    shot = Shot(start=time.perf_counter())
    try:
        async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                shot.error = f"{response.status_code}: {(await response.aread())[:200]!r}"
                shot.end = time.perf_counter()
                return shot
            async for message in aparse_lines(response.aiter_lines()):
                _read_chunk(shot, message.data)
        shot.ok = True
    except (httpx.HTTPError, ValueError) as exc:
        shot.error = f"{type(exc).__name__}: {exc}"[:200]
    shot.end = time.perf_counter()
    if not shot.tokens:
        shot.tokens = len(shot.chunks)
    return shot


def _read_chunk(shot: Shot, data: str) -> None:
    if data == "[DONE]":
        return
    payload = json.loads(data)
    usage = payload.get("usage")
    if usage:
        shot.tokens = int(usage.get("completion_tokens") or 0)
    choices = payload.get("choices") or [{}]
    if (choices[0].get("delta") or {}).get("content"):
        shot.chunks.append(time.perf_counter())


@dataclass
class Trace:
    """One job as a client saw it, from submit."""

    first_s: float | None = None
    """The first `partial` event (ASR segment, TTS audio, LLM text)."""
    total_s: float = 0.0
    output: dict[str, JsonValue] = field(default_factory=dict)
    """The job's output (its kind's JSON)."""
    timings: Timings = field(default_factory=Timings)
    error: str | None = None


async def run_job(
    client: httpx.AsyncClient, kind: str, inp: dict[str, JsonValue], timeout_s: float = 900.0
) -> Trace:
    """Submit a job and follow its events over SSE until it ends (or `timeout_s`)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _follow(client, {"kind": kind, "input": inp})
    except TimeoutError:
        return Trace(error=f"no end within {timeout_s:g}s")


async def _follow(client: httpx.AsyncClient, body: JobRequest) -> Trace:
    trace = Trace()
    start = time.perf_counter()
    try:
        r = await client.post("/v1/jobs", json=body)
        if r.status_code != 202:
            return Trace(error=f"submit {r.status_code}: {r.text[:200]}")
        job_id = r.json()["id"]
        async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            async for message in aparse_lines(response.aiter_lines()):
                event: Event = json.loads(message.data)
                if event["type"] == "partial" and trace.first_s is None:
                    trace.first_s = time.perf_counter() - start
                elif event["type"] == "output":
                    trace.output = event["data"]
                elif event["type"] == "status" and ends_job(event["type"], event["data"]):
                    status = event["data"]
                    if status["status"] != "succeeded":
                        trace.error = f"{status['status']}: {status.get('error')}"[:300]
                    break
        trace.total_s = time.perf_counter() - start
        job: Job = (await client.get(f"/v1/jobs/{job_id}")).json()
        trace.timings = job.get("timings") or {}
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        trace.error = f"{type(exc).__name__}: {exc}"[:300]
    return trace
