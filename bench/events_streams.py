"""The clients of `bench.events`: SSE streams that note when each event arrives, and the
API calls that make and end their jobs."""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from websockets.asyncio.client import connect as ws_connect

from common.sse import SseParser
from jobs.states import TERMINAL_VALUES

NOOP_KIND = "noop"
REQUEST_LANES = 32
"""Concurrent submits and cancels."""
T = TypeVar("T")


class Tracker:
    """Counts progress receipts over all streams; `done` is set once `expect`'s target is hit."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.done = asyncio.Event()

    def expect(self, more: int) -> None:
        self.target = self.count + more
        self.done.clear()

    def hit(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.done.set()

    def forgo(self, fewer: int) -> None:
        """`fewer` of the expected events were never published."""
        self.target -= fewer
        if self.count >= self.target:
            self.done.set()


@dataclass
class Stream:
    """One SSE client: what it received, raw, and how it ended."""

    job_id: str
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the replayed `queued` event arrived, or the stream failed first."""
    ready: bool = False
    ended: bool = False
    """The terminal status event arrived."""
    error: str = ""
    received: list[tuple[int, str]] = field(default_factory=list)
    """(receipt time.time_ns(), SSE data) of each progress event; parsed after the level."""


def on_event(stream: Stream, tracker: Tracker, kind: str, data: str) -> None:
    """One event of the stream: a progress event is a receipt (timed now)."""
    if kind == "progress":
        stream.received.append((time.time_ns(), data))
        tracker.hit()
    elif kind == "status":
        on_status(stream, data)


def on_status(stream: Stream, data: str) -> None:
    status = json.loads(data).get("data", {}).get("status")
    if status == "queued":
        stream.ready = True
        stream.settled.set()
    elif status in TERMINAL_VALUES:
        stream.ended = True


async def read_stream(client: httpx.AsyncClient, stream: Stream, tracker: Tracker) -> None:
    """Follow the job's events until the server ends the stream; never raises."""
    try:
        async with client.stream("GET", f"/v1/jobs/{stream.job_id}/events") as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                stream.error = f"open: HTTP {response.status_code} {body[:120]}"
                return
            parser = SseParser()
            async for line in response.aiter_lines():
                message = parser.feed(line)
                if message is not None:
                    on_event(stream, tracker, message.event, message.data)
        if not stream.ended:
            stream.error = "stream closed before the terminal status"
    except Exception as exc:
        stream.error = f"stream: {type(exc).__name__}: {exc}"[:200]
    finally:
        stream.settled.set()


async def read_ws(api_url: str, stream: Stream, tracker: Tracker) -> None:
    """Follow the job's events on its websocket until the server closes it; never raises."""
    url = api_url.replace("http", "ws", 1) + f"/v1/jobs/{stream.job_id}/ws"
    try:
        async with ws_connect(url, max_queue=None, compression=None) as ws:
            async for message in ws:
                text = message if isinstance(message, str) else message.decode()
                # The type is in the JSON here; an SSE stream names it on its `event:` line.
                on_event(stream, tracker, json.loads(text)["type"], text)
        if not stream.ended:
            stream.error = "websocket closed before the terminal status"
    except Exception as exc:
        stream.error = f"websocket: {type(exc).__name__}: {exc}"[:200]
    finally:
        stream.settled.set()


async def open_streams(
    stack: AsyncExitStack,
    api_url: str,
    job_ids: list[str],
    tracker: Tracker,
    lanes: int,
    transport: str = "sse",
) -> tuple[list[Stream], list[asyncio.Task[None]]]:
    """One stream per job (SSE, or websockets with `transport="ws"`), `lanes` opening at
    a time, each until its `queued` replay.

    Each batch of `lanes` streams has an httpx client of its own (closed by `stack`):
    httpx's pool scans all its connections whenever one is released, so one pool of
    1000 streams makes the bench itself slow (and would bias its receipt times)."""
    streams = [Stream(job_id) for job_id in job_ids]
    tasks: list[asyncio.Task[None]] = []
    for start in range(0, len(streams), lanes):
        batch = streams[start : start + lanes]
        if transport == "ws":
            tasks += [asyncio.create_task(read_ws(api_url, s, tracker)) for s in batch]
        else:
            client = await stack.enter_async_context(http_client(api_url, len(batch)))
            tasks += [asyncio.create_task(read_stream(client, s, tracker)) for s in batch]
        waits = [asyncio.wait_for(s.settled.wait(), 30) for s in batch]
        for stream, outcome in zip(
            batch, await asyncio.gather(*waits, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, BaseException) and not stream.error:
                stream.error = "open: no queued event within 30s"
    return streams, tasks


def http_client(api_url: str, connections: int) -> httpx.AsyncClient:
    """A client with room for `connections` at once; no read timeout (streams idle)."""
    return httpx.AsyncClient(
        base_url=api_url,
        timeout=httpx.Timeout(30.0, read=None),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        trust_env=False,
    )


async def in_lanes(calls: Sequence[Callable[[], Awaitable[T]]], lanes: int) -> list[T]:
    """Run `calls` with at most `lanes` in flight; results in order."""
    gate = asyncio.Semaphore(lanes)

    async def gated(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return await asyncio.gather(*(gated(call) for call in calls))


async def submit_job(client: httpx.AsyncClient, attempts: int = 3) -> str:
    """A queued noop job's id, or raises RuntimeError with the API's answer. A lost
    connection is retried under the same Idempotency-Key, so no job is made twice."""
    body = {"kind": NOOP_KIND, "input": {"payload": "events bench"}}
    headers = {"Idempotency-Key": secrets.token_hex(16)}
    for attempt in range(1, attempts + 1):
        try:
            response = await client.post("/v1/jobs", json=body, headers=headers)
            break
        except httpx.TransportError as exc:
            if attempt == attempts:
                raise RuntimeError(f"submit: {type(exc).__name__}: {exc}") from exc
    if response.status_code not in (200, 201, 202):
        raise RuntimeError(f"submit: HTTP {response.status_code} {response.text[:200]}")
    return str(response.json()["id"])


async def submit_jobs(client: httpx.AsyncClient, count: int) -> list[str]:
    return await in_lanes([lambda: submit_job(client)] * count, REQUEST_LANES)


async def cancel_job(client: httpx.AsyncClient, job_id: str) -> str | None:
    try:
        response = await client.post(f"/v1/jobs/{job_id}/cancel")
    except httpx.HTTPError as exc:
        return f"cancel: {type(exc).__name__}: {exc}"[:200]
    return None if response.status_code == 200 else f"cancel: HTTP {response.status_code}"


async def cancel_jobs(client: httpx.AsyncClient, job_ids: list[str]) -> list[str]:
    calls = [functools.partial(cancel_job, client, job_id) for job_id in job_ids]
    return [error for error in await in_lanes(calls, REQUEST_LANES) if error]
