"""LLM: the service beside its engine called directly, one request at a time and at load.

An mmq LLM worker starts its engine server on the device (`transformers serve`; `vllm
serve` too where vLLM is installed) on a known port. The same streamed chat requests go
to `POST /v1/chat/completions` of the API (through Redis and the worker) and straight to
the engine's port: time to first token, end to end, and tokens per second. Requests are
greedy with `max_tokens`; the random model never emits its end token, so every request
decodes exactly `max_tokens` tokens (tests/support/models/llm.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.gpu_common import Context, Plan, SectionResult, Table, latency_columns, ratio
from common.procs import free_port
from common.sse import aparse_lines

COLUMNS = ["path", "concurrency", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s"]
COLUMNS += ["tokens_per_s", "busy_pct", "mem_mib", "failed"]
FILLER = "Tell me a long story about a lighthouse keeper, the sea and the weather. "


@dataclass
class Shot:
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0
    error: str | None = None


def vllm_bin(explicit: str | None) -> str | None:
    return explicit or shutil.which("vllm")


class LlmSection:
    name = "llm"

    def __init__(self, vllm: str | None) -> None:
        self.vllm = vllm
        self.ports: dict[str, int] = {}

    def engines(self, plan: Plan) -> dict[str, str]:
        """Pipeline name -> engine, for the engines this run has."""
        found = {"llm_tf": "transformers"}
        if self.vllm and plan.device == "cuda":
            found["llm_vllm"] = "vllm"
        return found

    def pipelines(self, plan: Plan, models: Any) -> dict[str, dict[str, Any]]:
        tables = {}
        for name, engine in self.engines(plan).items():
            self.ports[name] = free_port()
            options: dict[str, Any] = {
                "engine": engine,
                "max_inflight": plan.llm_concurrency,
                "max_model_len": 1024 if plan.device == "cuda" else 256,
                "dtype": "bfloat16" if plan.device == "cuda" else "auto",
                "port": self.ports[name],
                "startup_timeout_s": 900,
                "cache_ttl_s": 0,
            }
            if engine == "vllm":
                options |= {"engine_bin": self.vllm, "gpu_memory_utilization": 0.85}
            tables[name] = {
                "kind": "llm",
                "impl": "pipelines.llm:LlmPipeline",
                "model": models.llm,
                "device": plan.worker_device,
                "options": options,
            }
        return tables

    def groups(self, plan: Plan) -> list[tuple[dict[str, int], int]]:
        return [({name: 1}, 0) for name in self.engines(plan)]

    def run(self, ctx: Context) -> SectionResult:
        plan = ctx.plan
        result = SectionResult("llm")
        table = Table(
            f"LLM: {plan.llm_requests} chat requests of ~{plan.llm_prompt_words} words, "
            f"{plan.llm_max_tokens} tokens each, {ctx.models.labels['llm']}",
            COLUMNS,
        )
        for name, engine in self.engines(plan).items():
            group = ctx.workers({name: 1})
            result.loads += ctx.worker_loads(group, {name: f"{ctx.models.labels['llm']}"})
            rows = asyncio.run(self._measure(ctx, name, engine))
            ctx.stop(group)
            table.rows += rows
            by = {(r["target"], r["concurrency"]): r for r in rows}
            for c in (1, plan.llm_concurrency):
                service, direct = by[("service", c)], by[("direct", c)]
                key = f"{engine} c={c}: service / direct"
                result.ratios[f"{key} TTFT p50"] = ratio(
                    service["ttft_p50_s"], direct["ttft_p50_s"]
                )
                result.ratios[f"{key} tokens/s"] = ratio(
                    service["tokens_per_s"], direct["tokens_per_s"]
                )
        if "llm_vllm" not in self.engines(plan):
            result.notes.append("vLLM is not installed here (or not on a GPU): not measured.")
        result.tables.append(table)
        return result

    async def _measure(self, ctx: Context, name: str, engine: str) -> list[dict[str, Any]]:
        plan = ctx.plan
        engine_url = f"http://127.0.0.1:{self.ports[name]}"
        targets = {
            "direct": (engine_url, ctx.models.llm, {}),
            "service": (ctx.deployment.api_url, name, {"cache": False}),
        }
        rows = []
        async with httpx.AsyncClient(timeout=1800, trust_env=False) as http:
            for base, model, extra in targets.values():  # warm both paths
                await _chat(http, base, model, "warm up", 4, extra)
            for concurrency in (1, plan.llm_concurrency):
                requests = plan.llm_requests if concurrency > 1 else min(8, plan.llm_requests)
                for target, (base, model, extra) in targets.items():
                    phase = f"llm {engine} {target} c={concurrency}"
                    with ctx.sampler.phase(phase):
                        shots, wall_s = await _burst(
                            http, base, model, extra, plan, requests, concurrency
                        )
                    row = _row(f"{engine}, {target}", shots, wall_s) | ctx.usage(phase)
                    rows.append(row | {"target": target, "concurrency": concurrency})
        return rows


async def _burst(
    http: httpx.AsyncClient,
    base: str,
    model: str,
    extra: dict[str, Any],
    plan: Plan,
    requests: int,
    concurrency: int,
) -> tuple[list[Shot], float]:
    """`requests` chats, `concurrency` at a time (closed loop)."""
    todo = iter(range(requests))
    shots: list[Shot] = []

    async def lane() -> None:
        for i in todo:
            text = f"Request {i} at {time.time_ns()}. " + FILLER * (plan.llm_prompt_words // 14)
            shots.append(await _chat(http, base, model, text, plan.llm_max_tokens, extra))

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return shots, time.perf_counter() - start


async def _chat(
    http: httpx.AsyncClient,
    base: str,
    model: str,
    text: str,
    max_tokens: int,
    extra: dict[str, Any],
) -> Shot:
    """One streamed chat completion: TTFT, end to end, completion tokens."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    shot = Shot()
    start = time.perf_counter()
    chunks = 0
    try:
        async with http.stream("POST", f"{base}/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                body_text = (await response.aread())[:200]
                return Shot(error=f"{response.status_code}: {body_text!r}")
            async for message in aparse_lines(response.aiter_lines()):
                if message.data == "[DONE]":
                    break
                data = json.loads(message.data)
                if (data.get("usage") or {}).get("completion_tokens"):
                    shot.tokens = int(data["usage"]["completion_tokens"])
                choices = data.get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    chunks += 1
                    shot.ttft_s = shot.ttft_s or time.perf_counter() - start
    except (httpx.HTTPError, ValueError) as exc:
        return Shot(error=f"{type(exc).__name__}: {exc}"[:200])
    shot.e2e_s = time.perf_counter() - start
    shot.tokens = shot.tokens or chunks
    return shot


def _row(path: str, shots: list[Shot], wall_s: float) -> dict[str, Any]:
    ok = [s for s in shots if s.error is None]
    return {
        "path": path,
        **latency_columns("ttft", [s.ttft_s for s in ok]),
        **latency_columns("e2e", [s.e2e_s for s in ok]),
        "tokens_per_s": sum(s.tokens for s in ok) / wall_s if wall_s else None,
        "tokens": sum(s.tokens for s in ok),
        "failed": len(shots) - len(ok),
        "errors": sorted({s.error for s in shots if s.error})[:3],
    }
