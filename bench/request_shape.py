"""An LLM request's shape work, per request: what the API spends from a chat body's bytes
to the job input it stores, and what the worker spends from that stored input to the
engine's body. No Redis, no engine: only the models, in one process.

    python -m bench.request_shape [--repeats 15] [--out FILE.json]

Three bodies: a short chat (two turns), one with a tool and a JSON schema, and a
conversation of 20 turns. Each figure is the least of `--repeats` timings of 2,000 calls
(the least is the one the machine disturbed least). Run it in two checkouts, the code
before a change and after, one after the other, and compare them as ratios: before
issue 64's one shape (`LlmInput.from_record` absent) the API validated the body as
OpenAI's request, built the job input as a dict, validated that as the job's input and
dumped it, and the worker validated the stored input again and dumped its parts into the
engine's body.
"""

from __future__ import annotations

import argparse
import json
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.openai.chat_models import ChatRequest
from bench.common import run_meta
from jobs.schemas.llm import LlmInput
from pipelines.llm.engine_client import request_body

DEFAULT_OUT = Path("bench/results/request_shape.json")

TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
BODIES: dict[str, dict[str, Any]] = {
    "short chat": {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the world, please."},
        ],
        "max_tokens": 8,
        "temperature": 0.7,
        "stream": True,
    },
    "tools and a schema": {
        "model": "m",
        "messages": [{"role": "user", "content": "Weather in Oslo, as JSON?"}],
        "tools": [TOOL],
        "tool_choice": "auto",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": {"type": "object"}},
        },
        "stream": True,
    },
    "20 turns": {
        "model": "m",
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "x" * 80}
            for i in range(20)
        ],
        "stream": True,
    },
}

ONE_SHAPE = hasattr(LlmInput, "from_record")
"""Whether this checkout has issue 64's one request shape."""


def api_work(raw: bytes) -> Callable[[], object]:
    """The API's work for one body: validated, and made the job input it stores."""
    if ONE_SHAPE:
        return lambda: ChatRequest.model_validate_json(raw).llm_input().record()

    def before() -> object:
        inp = LlmInput.model_validate(ChatRequest.model_validate_json(raw).job_input())
        return inp.model_dump(mode="json")

    return before


def worker_work(stored: dict[str, Any]) -> Callable[[], object]:
    """The worker's work for one stored input: read, and made the engine's body."""
    if ONE_SHAPE:
        return lambda: request_body(LlmInput.from_record(stored).record(), "served")
    return lambda: request_body(LlmInput.model_validate(stored), "served")  # type: ignore[arg-type]


def _least_us(work: Callable[[], object], repeats: int, calls: int = 2000) -> float:
    return min(timeit.repeat(work, number=calls, repeat=repeats)) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rows = []
    print(f"code: {'one shape' if ONE_SHAPE else 'before one shape'}")
    print(f"{'body':<20} {'API µs':>8} {'worker µs':>10}")
    for name, body in BODIES.items():
        raw = json.dumps(body).encode()
        stored = json.loads(json.dumps(api_work(raw)()))  # as Redis gives it back
        api_us = _least_us(api_work(raw), args.repeats)
        worker_us = _least_us(worker_work(stored), args.repeats)
        rows.append({"body": name, "api_us": round(api_us, 1), "worker_us": round(worker_us, 1)})
        print(f"{name:<20} {api_us:>8.1f} {worker_us:>10.1f}")
    result = {"meta": run_meta(), "one_shape": ONE_SHAPE, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
