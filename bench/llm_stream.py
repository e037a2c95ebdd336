"""Streamed chat completions through mmq and straight to an engine, taking turns, and
per-level summaries: TTFT, TPOT, ITL, output tokens/s and goodput under an SLO (one
request is `tuning.load.stream_chat`: what it records, and the definitions)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.common import percentile_ms
from tuning import slo
from tuning.load import Shot, closed_loop, stream_chat


def Slo(ttft_ms: float, tpot_ms: float) -> tuple[slo.Slo, ...]:
    """Goodput's goal, as bench.llm and bench.gpu_llm name it: each request's TTFT and
    TPOT within these (`tuning.slo`'s rule: an answer of one token meets a TPOT goal)."""
    return slo.every_request(ttft=ttft_ms, tpot=tpot_ms)


def summarize(shots: list[Shot], wall_s: float, goal: Sequence[slo.Slo]) -> dict[str, Any]:
    ok = [s for s in shots if s.ok]
    tpots = [t for t in (s.tpot_s for s in ok) if t is not None]
    tokens = sum(s.tokens for s in ok)
    good = sum(slo.meets_all(goal, s.sample()) for s in ok)
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
        "goodput_rps": good / wall_s if wall_s > 0 else 0.0,
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
    goal: Sequence[slo.Slo],
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
                    got, wall = await closed_loop(one, per_block, concurrency)
                shots[target.name] += got
                walls[target.name] += wall
        for name, got in shots.items():
            out[f"{name} c={concurrency}"] = summarize(got, walls[name], goal)
    return out
