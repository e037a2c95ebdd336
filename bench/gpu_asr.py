"""ASR: mmq's cross-request batched decoding against one request at a time, through the
service, and faster-whisper's own `BatchedInferencePipeline` in process, on one model.

Through mmq: one pipeline (max_batch B) sent the same requests one at a time (every
batch holds one request) and over C closed-loop lanes (the engine batches what has
arrived, up to B); a request follows its job's events, so its first segment is the
first `partial` event. The engine waits `max_wait_ms` (20) for a batch to fill: a lone
request pays it too.
In process, with the mmq workers stopped: `BatchedInferencePipeline` (batch_size B) on
each file in turn, and on all the files joined into one (its best case: a long file).
"""

from __future__ import annotations

import asyncio
import io
import os
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import run_level
from bench.gpu_common import (
    Context,
    Plan,
    SectionResult,
    Stopwatch,
    Table,
    latency_columns,
    ratio,
)
from tuning.load import Trace, run_job

COLUMNS = ["path", "audio_s_per_s", "total_p50_s", "total_p99_s", "first_p50_s", "batch_sizes"]
COLUMNS += ["busy_pct", "mem_mib", "failed"]


class AsrSection:
    name = "asr"

    def pipelines(self, plan: Plan, models: Any) -> dict[str, dict[str, Any]]:
        return {
            "asr": {
                "kind": "asr",
                "impl": "pipelines.asr:AsrPipeline",
                "model": models.whisper,
                "device": plan.worker_device,
                "max_batch": plan.asr_max_batch,
                "max_wait_ms": 20,
                "concurrency": 2 * plan.asr_concurrency,
            }
        }

    def groups(self, plan: Plan) -> list[tuple[dict[str, int], int]]:
        return [({"asr": 1}, 0)]

    def run(self, ctx: Context) -> SectionResult:
        plan = ctx.plan
        audio = clip(plan)
        samples = _decode(audio)
        duration_s = len(samples) / 16000
        result = SectionResult("asr")
        table = Table(
            f"ASR: {plan.asr_requests} requests of {duration_s:.0f} s, max_batch "
            f"{plan.asr_max_batch}, {ctx.models.labels['asr']}",
            COLUMNS,
        )
        group = ctx.workers({"asr": 1})
        result.loads += ctx.worker_loads(group, {"asr": ctx.models.labels["asr"]})
        key = ctx.deployment.upload(audio, "speech.mp3")
        asyncio.run(_requests(ctx, key, 1, 1))  # warm: first call's costs
        for concurrency, path in (
            (1, "mmq, one request at a time"),
            (plan.asr_concurrency, f"mmq, {plan.asr_concurrency} at a time, batched"),
        ):
            phase = f"asr mmq c={concurrency}"
            with ctx.sampler.phase(phase):
                traces, wall_s = asyncio.run(_requests(ctx, key, plan.asr_requests, concurrency))
            table.rows.append(_row(path, traces, wall_s, duration_s) | ctx.usage(phase))
        ctx.stop(group)
        rows, load = _in_process(ctx, samples, duration_s)
        table.rows += rows
        result.loads.append(load)
        result.tables.append(table)
        one, batched = table.rows[0]["audio_s_per_s"], table.rows[1]["audio_s_per_s"]
        result.ratios = {
            "mmq batched / mmq one at a time (audio-s/s)": ratio(batched, one),
            "mmq batched / BatchedInferencePipeline per file": ratio(
                batched, table.rows[2]["audio_s_per_s"]
            ),
            "mmq batched / BatchedInferencePipeline one long file": ratio(
                batched, table.rows[3]["audio_s_per_s"]
            ),
        }
        result.notes.append(
            "Random weights: each window decodes a fixed ~100 tokens (harness/models/"
            "whisper.py), so a short window costs as much as a full one; text is not scored."
            if ctx.plan.device == "cuda"
            else "CPU: the packaged tiny.en (int8); batching is not how a CPU is used best."
        )
        return result


async def _requests(
    ctx: Context, key: str, requests: int, concurrency: int
) -> tuple[list[Trace], float]:
    traces: list[Trace] = []
    inp = {"audio": key, "model": "asr", "language": "en"}
    async with httpx.AsyncClient(
        base_url=ctx.deployment.api_url, timeout=1800, trust_env=False
    ) as client:

        async def call() -> str | None:
            trace = await run_job(client, "asr", inp)
            traces.append(trace)
            return trace.error

        _, wall_s = await run_level(call, requests, concurrency)
    return traces, wall_s


def _row(path: str, traces: list[Trace], wall_s: float, duration_s: float) -> dict[str, Any]:
    ok = [t for t in traces if t.error is None]
    return {
        "path": path,
        "audio_s_per_s": len(ok) * duration_s / wall_s if wall_s else None,
        **latency_columns("total", [t.total_s for t in ok]),
        **latency_columns("first", [t.first_s for t in ok if t.first_s is not None]),
        "failed": len(traces) - len(ok),
        "errors": sorted({t.error for t in traces if t.error})[:3],
        "batch_sizes": sorted({t.output.get("batch_size", 0) for t in ok}),
    }


def clip(plan: Plan) -> bytes:
    """The request's audio: `plan.asr_audio` where given (made ahead with `python -m
    bench.gpu --write-asr-audio FILE` on a host that has Piper), else spoken here."""
    if plan.asr_audio:
        return Path(plan.asr_audio).read_bytes()
    from harness.audio import LONG, SHORT, spoken

    return spoken(LONG if plan.asr_long else SHORT, "mp3")


def _decode(audio: bytes) -> Any:
    from faster_whisper import decode_audio

    return decode_audio(io.BytesIO(audio))


def _in_process(
    ctx: Context, samples: Any, duration_s: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`BatchedInferencePipeline` rows (each file, then one long file) and its load row."""
    import numpy as np
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    plan = ctx.plan
    clock = Stopwatch()
    gpu = plan.device == "cuda"
    model = WhisperModel(
        ctx.models.whisper,
        device="cuda" if gpu else "cpu",
        compute_type="float16" if gpu else "int8",
    )
    pipe = BatchedInferencePipeline(model)
    _transcribe(pipe, samples[: 16000 * 2], plan.asr_max_batch)  # warm
    mib = ctx.process_mib()
    load = {
        "model": ctx.models.labels["asr"],
        "where": "in process (BatchedInferencePipeline)",
        "instances": 1,
        "load_warm_s": clock(),
        "gpu_mib": mib.get(os.getpid()) if mib else None,
    }
    rows = []
    with ctx.sampler.phase("asr bip each"):
        firsts, totals, start = [], [], time.perf_counter()
        for _ in range(plan.asr_requests):
            first, total = _transcribe(pipe, samples, plan.asr_max_batch)
            firsts.append(first)
            totals.append(total)
        wall_s = time.perf_counter() - start
    rows.append(
        {
            "path": "BatchedInferencePipeline in process, each file in turn (no queue)",
            "audio_s_per_s": plan.asr_requests * duration_s / wall_s,
            **latency_columns("total", totals),
            **latency_columns("first", firsts),
            "failed": 0,
        }
        | ctx.usage("asr bip each")
    )
    joined = np.concatenate([samples] * plan.asr_requests)
    with ctx.sampler.phase("asr bip joined"):
        first, total = _transcribe(pipe, joined, plan.asr_max_batch)
    rows.append(
        {
            "path": f"BatchedInferencePipeline in process, one file of {plan.asr_requests} clips",
            "audio_s_per_s": plan.asr_requests * duration_s / total,
            **latency_columns("total", [total]),
            **latency_columns("first", [first]),
            "failed": 0,
        }
        | ctx.usage("asr bip joined")
    )
    del pipe, model
    return rows, load


def _transcribe(pipe: Any, samples: Any, batch_size: int) -> tuple[float, float]:
    """(first segment, total) seconds of one transcription."""
    start = time.perf_counter()
    segments, _ = pipe.transcribe(samples, language="en", batch_size=batch_size)
    first = None
    for _segment in segments:
        first = first or time.perf_counter() - start
    total = time.perf_counter() - start
    return first or total, total
