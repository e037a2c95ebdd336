"""Streamed chat completions measured as a client sees them, and per-level summaries.

One request (`stream_chat`) records when each chunk with text arrived and the completion
tokens the final usage chunk reports, so a level gives TTFT, TPOT, ITL, output tokens/s
and goodput under an SLO (the same definitions as vLLM's `benchmarks/serve.py`: TPOT is
(end to end - TTFT) / (tokens - 1); ITL the gaps between chunks that carry text).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import percentile_ms
from common.sse import aparse_lines


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


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    tpot_ms: float

    def met(self, shot: Shot) -> bool:
        tpot = shot.tpot_s
        ttft_ok = shot.ttft_s * 1000 <= self.ttft_ms
        return shot.ok and ttft_ok and (tpot is None or tpot * 1000 <= self.tpot_ms)


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
                _read(shot, message.data)
        shot.ok = True
    except (httpx.HTTPError, ValueError) as exc:
        shot.error = f"{type(exc).__name__}: {exc}"[:200]
    shot.end = time.perf_counter()
    if not shot.tokens:
        shot.tokens = len(shot.chunks)
    return shot


def _read(shot: Shot, data: str) -> None:
    if data == "[DONE]":
        return
    payload = json.loads(data)
    usage = payload.get("usage")
    if usage:
        shot.tokens = int(usage.get("completion_tokens") or 0)
    choices = payload.get("choices") or [{}]
    if (choices[0].get("delta") or {}).get("content"):
        shot.chunks.append(time.perf_counter())


async def closed_loop(requests: int, concurrency: int, one: Any) -> tuple[list[Shot], float]:
    """`requests` calls of `one(i)` over `concurrency` lanes (each sends its next as soon
    as its last came back); returns the shots and the wall time."""
    queue = iter(range(requests))
    shots: list[Shot] = []

    async def lane() -> None:
        for i in queue:
            shots.append(await one(i))

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return shots, time.perf_counter() - started


def summarize(shots: list[Shot], wall_s: float, slo: Slo) -> dict[str, Any]:
    ok = [s for s in shots if s.ok]
    tpots = [t for t in (s.tpot_s for s in ok) if t is not None]
    tokens = sum(s.tokens for s in ok)
    return {
        "requests": len(shots),
        "failures": len(shots) - len(ok),
        "errors": sorted({s.error for s in shots if not s.ok})[:3],
        "ttft_p50_ms": percentile_ms([s.ttft_s for s in ok], 50),
        "ttft_p99_ms": percentile_ms([s.ttft_s for s in ok], 99),
        "tpot_p50_ms": percentile_ms(tpots, 50),
        "itl_p50_ms": percentile_ms([g for s in ok for g in s.itls_s], 50),
        "e2e_p50_ms": percentile_ms([s.e2e_s for s in ok], 50),
        "tokens": tokens,
        "tokens_per_chunk": tokens / max(1, sum(len(s.chunks) for s in ok)),
        "output_tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "goodput_rps": sum(1 for s in ok if slo.met(s)) / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
    }


@dataclass(frozen=True)
class Target:
    """Where a comparison sends its chats: mmq's API or an engine's own port."""

    name: str
    base: str
    model: str
    extra: dict[str, Any] = field(default_factory=dict)


def caller(
    http: httpx.AsyncClient, target: Target, tag: str, max_tokens: int, prompt: str = ""
) -> Callable[[int], Awaitable[Shot]]:
    """Request `i` of a block: the same prompts for every target (temperature 0: the same
    answers), `prompt` after a unique head."""

    async def one(i: int) -> Shot:
        text = f"Request {tag}-{i}. {prompt}".strip()
        return await stream_chat(http, target.base, target.model, text, max_tokens, **target.extra)

    return one


async def compare(
    http: httpx.AsyncClient,
    targets: Sequence[Target],
    levels: Sequence[int],
    requests: int,
    max_tokens: int,
    slo: Slo,
    blocks: int = 2,
    on_block: Callable[[str], Any] | None = None,
    prompt: str = "",
) -> dict[str, dict[str, Any]]:
    """The targets at each concurrency (closed loop), taking turns in `blocks` blocks each
    so that a slow spell falls on all of them; at least two requests per lane;
    `{"<target> c=<level>": summary}`.
    `on_block(label)`, where given, is entered around each block (a sampler's phase)."""
    out: dict[str, dict[str, Any]] = {}
    for concurrency in levels:
        per_block = -(-max(requests, 2 * concurrency) // blocks)
        shots: dict[str, list[Shot]] = {t.name: [] for t in targets}
        walls = dict.fromkeys(shots, 0.0)
        for block in range(blocks):
            for target in targets:
                one = caller(http, target, str(block), max_tokens, prompt)
                label = f"{target.name} c={concurrency}"
                with on_block(label) if on_block else contextlib.nullcontext():
                    got, wall = await closed_loop(per_block, concurrency, one)
                shots[target.name] += got
                walls[target.name] += wall
        for name, got in shots.items():
            out[f"{name} c={concurrency}"] = summarize(got, walls[name], slo)
    return out
