"""Telling an engine that will never come up from one that is still loading, and saying why.

While the worker waits for its engine, any of these ends the wait at once: the process
exits; the engine answers the probe with a fatal error (`transformers serve`: 503 "CB
worker is dead" once its batching thread has died, e.g. on a KV cache too large for the
memory it measured); or a fatal line appears in the engine's log (out of memory, a CUDA
error, vLLM's engine core dying). The error keeps a short reason and the log's relevant
lines, which the worker records for `/readyz` and `mmq up`.
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_TAIL_BYTES = 4000
RELEVANT_LINES = 4
SUMMARY_MAX_CHARS = 1000
LINE_MAX_CHARS = 300

FATAL_LOG = re.compile(
    r"out of memory|OutOfMemoryError|\bMemoryError\b|CUDA error|"
    r"CB worker (?:is dead|died)|"
    r"Engine core initialization failed|EngineDeadError|EngineCore encountered|"
    r"No available memory for the cache blocks|larger than the available KV cache memory",
    re.IGNORECASE,
)
"""Lines of an engine's log after which it never serves (transformers 5.23, vLLM 0.33)."""
ERROR_LINE = re.compile(r"\b\w*(?:Error|Exception)\b|\berror\b|\bfatal\b", re.IGNORECASE)
LOG_PREFIX = re.compile(
    r"""^(?:\(\w+\ pid=\d+\)\s*)?
    (?:\d{4}-\d\d-\d\d[ T][\d:,.]+\s*-\s*\S+\s*-\s*[A-Z]+\s*-\s*
    |[A-Z]+\s+\d\d-\d\d\ [\d:.]+\s+\[[^\]]*\]\s*
    |\[\w+\]\s*)?
    """,
    re.VERBOSE,
)
"""What a log line starts with before its message: vLLM's engine core process
`(EngineCore_DP0 pid=7) `, then `2026-11-23 23:05:54,693 - Name - ERROR - ` (transformers'
batching thread), `ERROR 11-23 10:44:38 [core.py:123] ` (vLLM) or `[transformers] `."""
CODE_LINE = re.compile(r"(?:raise |File \"|Traceback |\^|~)")
"""A traceback's code and frame lines: the error's own line says more."""
FATAL_ANSWER = re.compile(r"CB worker (?:is dead|died)")
FOOTPRINT = re.compile(r"Memory footprint (\d+) is more than available memory (\d+)")


class EngineStartError(RuntimeError):
    """The engine did not come up: a short reason, and the tail of its log."""

    def __init__(self, reason: str, log_path: Path | None = None, tail: str = "") -> None:
        self.reason = reason
        self.log_path = log_path
        self.tail = tail
        detail = f"; log {log_path} ends with:\n{tail}" if log_path is not None else ""
        super().__init__(reason + detail)

    @property
    def summary(self) -> str:
        """The reason, the log's relevant lines and the log's path, capped: what the
        worker records for /readyz and `mmq up`."""
        lines = [self.reason, *relevant_lines(self.tail, self.reason)]
        if self.log_path is not None:
            lines.append(f"engine log: {self.log_path}")
        return "\n".join(line[:LINE_MAX_CHARS] for line in lines)[:SUMMARY_MAX_CHARS]


def fatal_answer(status: int, body: str) -> str | None:
    """The reason in an engine's answer to the probe that means it will never serve."""
    if status < 500 or FATAL_ANSWER.search(body) is None:
        return None
    message = body.strip()
    footprint = FOOTPRINT.search(message)
    if footprint is not None:
        return f"CB worker is dead ({_footprint(footprint)})"
    return message[:LINE_MAX_CHARS]


def humane(line: str) -> str:
    """`line` with transformers' memory figures in GB."""
    return FOOTPRINT.sub(_footprint, line)


def _footprint(match: re.Match[str]) -> str:
    need, have = (int(n) / 1e9 for n in match.groups())
    return f"KV cache and buffers of {need:.1f} GB > {have:.1f} GB available"


def relevant_lines(tail: str, said_already: str = "") -> list[str]:
    """The last fatal or error lines of a log tail, else its last lines; without log
    prefixes, and without a message that a later line or `said_already` repeats (a
    logged error and its exception's last line)."""
    lines = [humane(LOG_PREFIX.sub("", line.strip())) for line in tail.splitlines()]
    lines = [line for line in lines if line]
    said = [line for line in lines if not CODE_LINE.match(line)]
    picked = [line for line in said if FATAL_LOG.search(line) or ERROR_LINE.search(line)]
    chosen = picked or said or lines
    fresh = [
        line
        for i, line in enumerate(chosen)
        if _message(line) not in said_already
        and not any(_message(line) == _message(later) for later in chosen[i + 1 :])
    ]
    return fresh[-RELEVANT_LINES:]


def _message(line: str) -> str:
    """A line's message without what names it: `MemoryError: X` and `Error in loop: X`."""
    return line.split(": ", 1)[-1]


class LogWatch:
    """Reads what an engine's log gained after byte `offset` (this start), for fatal lines."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        self._partial = ""

    def fatal_line(self) -> str | None:
        """The first fatal line written since the last call, if any."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        text = self._partial + data.decode(errors="replace")
        complete, _, self._partial = text.rpartition("\n")
        for line in complete.splitlines():
            if FATAL_LOG.search(line):
                return humane(line.strip())[:LINE_MAX_CHARS]
        return None


def log_tail(path: Path, start: int = 0) -> str:
    """The last LOG_TAIL_BYTES of the log after byte `start` (this start's part)."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(start, path.stat().st_size - LOG_TAIL_BYTES))
        return f.read().decode(errors="replace")
