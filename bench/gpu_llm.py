"""LLM: the service beside its engine called directly, one request at a time and at load.

An mmq LLM worker starts its engine server on the device (`transformers serve`; `vllm
serve` too where vLLM is installed) on a known port. The same streamed chat requests go
to `POST /v1/chat/completions` of the API (through Redis and the worker) and straight to
the engine's port, taking turns (`bench.llm_stream.compare`, as `bench.llm` does): TTFT,
TPOT, ITL, end to end, output tokens/s and goodput. Requests are
greedy with `max_tokens`; the random model never emits its end token, so every request
decodes exactly `max_tokens` tokens (harness/models/llm.py).
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any

import httpx

from bench.gpu_common import Context, Plan, SectionResult, Table, ratio
from bench.llm_stream import Slo, Target, compare, stream_chat
from common.procs import free_port

COLUMNS = ["path", "concurrency", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p50_ms"]
COLUMNS += ["e2e_p50_ms", "output_tokens_per_s", "goodput_rps", "busy_pct", "mem_mib", "failed"]
FILLER = "Tell me a long story about a lighthouse keeper, the sea and the weather. "
SLO = Slo(ttft_ms=500, tpot_ms=100)
"""Goodput's SLO, as bench.llm's default."""


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
                for column, label in (
                    ("ttft_p50_ms", "TTFT p50"),
                    ("e2e_p50_ms", "E2E p50"),
                    ("output_tokens_per_s", "tokens/s"),
                ):
                    result.ratios[f"{key} {label}"] = ratio(service[column], direct[column])
        if "llm_vllm" not in self.engines(plan):
            result.notes.append("vLLM is not installed here (or not on a GPU): not measured.")
        result.tables.append(table)
        return result

    async def _measure(self, ctx: Context, name: str, engine: str) -> list[dict[str, Any]]:
        plan = ctx.plan
        targets = [
            Target("direct", f"http://127.0.0.1:{self.ports[name]}", ctx.models.llm),
            Target("service", ctx.deployment.api_url, name, {"cache": False}),
        ]
        levels = (1, plan.llm_concurrency)
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(timeout=1800, trust_env=False, limits=limits) as http:
            for target in targets:  # warm both paths
                await stream_chat(http, target.base, target.model, "warm up", 4, **target.extra)
            summaries = await compare(
                http,
                targets,
                levels,
                plan.llm_requests,
                plan.llm_max_tokens,
                SLO,
                on_block=lambda label: ctx.sampler.phase(f"llm {engine} {label}"),
                prompt=FILLER * max(1, plan.llm_prompt_words // 14),
            )
        rows = []
        for c in levels:
            for target in targets:
                summary = summaries[f"{target.name} c={c}"]
                usage = ctx.usage(f"llm {engine} {target.name} c={c}")
                rows.append(
                    summary
                    | usage
                    | {
                        "path": f"{engine}, {target.name}",
                        "target": target.name,
                        "concurrency": c,
                        "failed": summary["failures"],
                    }
                )
        return rows
