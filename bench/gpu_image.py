"""Images through mmq: the same requests one at a time and all at once (one batch).

One `image` pipeline with `max_batch` = the number of requests. One at a time: each job
is submitted when the previous one has ended. Batched: all are submitted together and
the engine runs them as one diffusers call. The requests (`bench.image`'s) share size,
steps and scheduler, so they share a batch key; each has its own prompt and seed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from bench.gpu_common import Context, Plan, SectionResult, Table, ratio
from bench.image import Shot, all_at_once, one, one_at_a_time, summarize

COLUMNS = ["path", "images_per_s", "p50_s", "p95_s", "first_step_p50_s", "batches"]
COLUMNS += ["busy_pct", "mem_mib", "failed"]
MODES = {"one at a time": one_at_a_time, "batched": all_at_once}


class ImageSection:
    name = "image"

    def pipelines(self, plan: Plan, models: Any) -> dict[str, dict[str, Any]]:
        return {
            "image": {
                "kind": "image",
                "impl": "pipelines.image:ImagePipeline",
                "model": models.sd,
                "device": plan.worker_device,
                "max_batch": plan.image_requests,
                "max_wait_ms": 100,
                "concurrency": 2 * plan.image_requests,
                "options": {"dtype": "auto", "schedulers": ["euler"]},
            }
        }

    def groups(self, plan: Plan) -> list[tuple[dict[str, int], int]]:
        return [({"image": 1}, 0)]

    def run(self, ctx: Context) -> SectionResult:
        plan = ctx.plan
        result = SectionResult("image")
        args = argparse.Namespace(
            size=plan.image_size,
            steps=plan.image_steps,
            scheduler="euler",
            requests=plan.image_requests,
        )
        title = (
            f"Image: {plan.image_requests} requests of {plan.image_size}x{plan.image_size}, "
            f"{plan.image_steps} steps, {ctx.models.labels['image']}"
        )
        table = Table(title, COLUMNS)
        group = ctx.workers({"image": 1})
        result.loads += ctx.worker_loads(group, {"image": ctx.models.labels["image"]})
        shots, walls = asyncio.run(_run(ctx, args, rounds=1 if plan.quick else 2))
        ctx.stop(group)
        for mode, found in shots.items():
            summary = summarize(mode, found, walls[mode])
            table.rows.append(
                {
                    "path": f"mmq, {mode}",
                    "images_per_s": summary.images_per_s,
                    "p50_s": summary.p50_ms / 1000,
                    "p95_s": summary.p95_ms / 1000,
                    "first_step_p50_s": summary.ttfp_p50_ms / 1000,
                    "batches": ",".join(map(str, summary.batch_sizes)),
                    "failed": summary.failures,
                    "errors": summary.errors,
                }
                | ctx.usage(f"image {mode}")
            )
        result.tables.append(table)
        result.ratios["batched / one at a time (images/s)"] = ratio(
            table.rows[1]["images_per_s"], table.rows[0]["images_per_s"]
        )
        return result


async def _run(
    ctx: Context, args: argparse.Namespace, rounds: int
) -> tuple[dict[str, list[Shot]], dict[str, float]]:
    """Each mode `rounds` times, the order alternating, after a warm-up of each."""
    shots: dict[str, list[Shot]] = {mode: [] for mode in MODES}
    walls = dict.fromkeys(MODES, 0.0)
    url = ctx.deployment.api_url
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        await one(client, args, 0)
        await all_at_once(client, args)
        for round_no in range(rounds):
            for mode in list(MODES) if round_no % 2 == 0 else list(reversed(MODES)):
                start = time.perf_counter()
                with ctx.sampler.phase(f"image {mode}"):
                    shots[mode] += await MODES[mode](client, args)
                walls[mode] += time.perf_counter() - start
    return shots, walls
