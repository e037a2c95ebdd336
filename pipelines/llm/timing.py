"""Token timings of one generation, as the worker sees the engine's stream."""

from __future__ import annotations

import time


class TokenClock:
    """TTFT, TPOT, mean ITL and E2E of one streamed generation.

    TTFT: request sent to first chunk. E2E: request sent to the last chunk.
    TPOT = (E2E - TTFT) / (tokens - 1). ITL: mean gap between consecutive chunks.
    """

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.first: float | None = None
        self.last: float | None = None
        self.chunks = 0

    def chunk(self) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        self.chunks += 1

    def timings(self, tokens: int) -> dict[str, float]:
        end = self.last if self.last is not None else time.monotonic()
        e2e = (end - self.started) * 1000
        out = {"e2e_ms": round(e2e, 3)}
        if self.first is None:
            return out
        ttft = (self.first - self.started) * 1000
        out["ttft_ms"] = round(ttft, 3)
        if tokens > 1:
            out["tpot_ms"] = round((e2e - ttft) / (tokens - 1), 3)
        if self.chunks > 1:
            out["itl_ms"] = round((end - self.first) * 1000 / (self.chunks - 1), 3)
        return out
