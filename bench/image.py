"""Image batching: N requests one at a time vs all at once, through the service.

    python -m bench.image [--model tiny|sd15|HUB_ID|DIR] [--device cpu|gpu:0]
                          [--size 64] [--steps 8] [--requests 8] [--rounds 2]
                          [--out bench/results/image.json]

It starts Redis, the API and one image worker (its own config: `max_batch` = requests,
`max_wait_ms` = `--max-wait-ms`, which a request that follows another closely waits
for mates, `concurrency` = 2 x requests) on free ports, then in the same run measures `--requests`
image jobs (same size, steps, guidance: one batch key; a prompt and seed each):

- one at a time: each submitted when the previous one has ended;
- batched: all submitted at once, so the engine runs them as one pipeline call.

Beside them, `diffusers in process`: the same model loaded by diffusers in this process and
called one request at a time with the same prompts, seeds, size, steps and scheduler (what
mmq adds to a lone request, as a ratio of p50s).

Per mode: images/s over the mode's wall time, p50/p95 latency (submit to end, seen by the
client), p50/p95 time to first progress event (the job's `time_to_first_output_ms`) and
the batch sizes the worker reported. `--rounds` alternates the order of the modes.
Goal: batched images/s >= 1.5x one at a time.

Models: `tiny` is the test fixture's tiny Stable Diffusion (random weights); `sd15` builds
SD 1.5's full architecture from its published configs with random weights (the real
model's compute, no download; float16 on disk, 2 GB; run it on a GPU: `--device gpu:0`);
anything else is a hub id or a model directory. `--model-dir` keeps a built model.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms
from bench.overhead import jsonable
from tuning.deployment import Deployment, private_deployment

DEFAULT_OUT = Path("bench/results/image.json")
PIPELINE = "bench-image"
GOAL_RATIO = 1.5
JOB_TIMEOUT_S = 1800.0
PROMPTS = [
    "a lighthouse on a cliff at dusk",
    "a bowl of ramen, studio photo",
    "a red fox in fresh snow",
    "an old map of an imaginary island",
    "a robot watering plants",
    "a city street in the rain at night",
    "a watercolor of mountains",
    "a cat sleeping on a windowsill",
]
console = Console(width=None if sys.stdout.isatty() else 120)


@dataclass
class Shot:
    ok: bool
    latency_s: float
    ttfp_ms: float | None = None
    batch_requests: int | None = None
    error: str = ""


@dataclass
class ModeResult:
    mode: str
    requests: int
    failures: int
    wall_s: float
    images_per_s: float
    p50_ms: float
    p95_ms: float
    ttfp_p50_ms: float
    ttfp_p95_ms: float
    batch_sizes: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__)
    parser.add_argument("--model", default="tiny", help="tiny, sd15, a hub id or a directory")
    parser.add_argument("--model-dir", type=Path, help="where to build tiny/sd15 (kept)")
    parser.add_argument("--device", default="cpu", help="cpu, gpu:N (the worker's device)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16, bfloat16")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--scheduler", default="euler", help="scheduler of every request")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument(
        "--max-wait-ms", type=float, default=50.0, help="the engine's wait for a batch to fill"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both modes")
    parser.add_argument("--compile", action="store_true", help="torch.compile the UNet")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.rounds < 1 or args.size % 8:
        parser.error("--requests and --rounds must be >= 1, --size a multiple of 8")
    return args


# --- model and deployment --------------------------------------------------------------


def model_path(args: argparse.Namespace, stack: ExitStack) -> str:
    """The model to serve: `--model`, or tiny / sd15 built here."""
    if args.model not in {"tiny", "sd15"}:
        return str(args.model)
    from harness.models.sd import build_sd

    root = args.model_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
    path = Path(root) / args.model
    if not (path / "model_index.json").exists():
        console.print(f"building {args.model} (random weights) in {path} ...")
        build_sd(path, args.model)
    return str(path)


def config_toml(args: argparse.Namespace, model: str) -> str:
    options = {"dtype": args.dtype, "compile": args.compile, "schedulers": [args.scheduler]}
    lines = [
        f"[pipelines.{PIPELINE}]",
        'kind = "image"',
        'impl = "pipelines.image:ImagePipeline"',
        f"model = {json.dumps(model)}",
        f"device = {json.dumps(args.device)}",
        f"max_batch = {args.requests}",
        f"max_wait_ms = {args.max_wait_ms}",
        f"concurrency = {2 * args.requests}",
        f"[pipelines.{PIPELINE}.options]",
        *(f"{key} = {json.dumps(value)}" for key, value in options.items()),
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def deploy(args: argparse.Namespace, model: str) -> Iterator[Deployment]:
    """Redis, the API and the image worker, on free ports (the hub offline: a built model
    or one in the local cache), until `/readyz` answers."""
    env = {
        "MMQ_AUTH__REQUIRED": "false",
        "MMQ_API__HOST": "127.0.0.1",
        "MMQ_LOG_LEVEL": args.log_level.upper(),  # readiness is read from /readyz
        "MMQ_LIMITS__IMAGE_MAX_SIDE": str(max(1024, args.size)),
        "MMQ_LIMITS__IMAGE_MAX_STEPS": str(max(100, args.steps)),
    }
    config = config_toml(args, model)
    with private_deployment(
        config, env, [], "mmq-bench-image-", test_pipelines=False, reaper=False
    ) as dep:
        dep.start_worker(PIPELINE, wait=False)
        dep.wait_ready(timeout_s=600)
        yield dep


# --- requests --------------------------------------------------------------------------


async def one(client: httpx.AsyncClient, args: argparse.Namespace, i: int) -> Shot:
    """One image job, submit to end."""
    inp = {
        "prompt": PROMPTS[i % len(PROMPTS)],
        "seed": i,
        "width": args.size,
        "height": args.size,
        "steps": args.steps,
        "scheduler": args.scheduler,
    }
    start = time.perf_counter()
    try:
        r = await client.post("/v1/jobs", json={"kind": "image", "input": inp})
        job = r.json()
        while r.status_code < 300 and job["status"] not in {"succeeded", "failed", "canceled"}:
            r = await client.get(f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=30"})
            job = r.json()
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return Shot(False, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - start
    if job.get("status") != "succeeded":
        return Shot(False, latency, error=json.dumps(job.get("error") or job)[:200])
    ttfp = job["timings"].get("time_to_first_output_ms")
    return Shot(True, latency, ttfp, job["output"]["batch"]["requests"])


async def one_at_a_time(client: httpx.AsyncClient, args: argparse.Namespace) -> list[Shot]:
    return [await one(client, args, i) for i in range(args.requests)]


async def all_at_once(client: httpx.AsyncClient, args: argparse.Namespace) -> list[Shot]:
    return list(await asyncio.gather(*(one(client, args, i) for i in range(args.requests))))


MODES = {"one at a time": one_at_a_time, "batched": all_at_once}
DIRECT = "diffusers in process"


class Direct:
    """The same model through diffusers in this process, one request at a time, with the
    same prompts, seeds, size, steps and scheduler: what mmq adds to a lone request."""

    def __init__(self, model: str, args: argparse.Namespace) -> None:
        import diffusers

        from jobs.schemas.image import SCHEDULERS
        from pipelines.image.load import torch_device

        self.args = args
        self.device = torch_device(args.device)
        dtype = torch_dtype_of(args.dtype, self.device)
        self.pipe = diffusers.AutoPipelineForText2Image.from_pretrained(
            model, dtype=dtype, safety_checker=None
        )
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        spec = SCHEDULERS[args.scheduler]
        scheduler_cls = getattr(diffusers, spec.cls)
        self.pipe.scheduler = scheduler_cls.from_config(self.pipe.scheduler.config, **spec.kwargs)

    def one(self, i: int) -> Shot:
        import torch

        start = time.perf_counter()
        self.pipe(
            PROMPTS[i % len(PROMPTS)],
            height=self.args.size,
            width=self.args.size,
            num_inference_steps=self.args.steps,
            generator=torch.Generator(self.device).manual_seed(i),
        )
        return Shot(True, time.perf_counter() - start)

    async def one_at_a_time(self) -> list[Shot]:
        return [await asyncio.to_thread(self.one, i) for i in range(self.args.requests)]


def torch_dtype_of(name: str, device: Any) -> Any:
    import torch

    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


async def run_modes(api_url: str, args: argparse.Namespace, direct: Direct) -> list[ModeResult]:
    modes = {**MODES, DIRECT: lambda _client, _args: direct.one_at_a_time()}
    shots: dict[str, list[Shot]] = {mode: [] for mode in modes}
    walls: dict[str, float] = dict.fromkeys(modes, 0.0)
    async with httpx.AsyncClient(base_url=api_url, timeout=60, trust_env=False) as client:
        console.print("warming up (one request, then one batch) ...")
        await one(client, args, 0)
        await all_at_once(client, args)
        await asyncio.to_thread(direct.one, 0)
        for round_no in range(args.rounds):
            order = list(modes) if round_no % 2 == 0 else list(reversed(modes))
            for mode in order:
                start = time.perf_counter()
                shots[mode] += await modes[mode](client, args)
                walls[mode] += time.perf_counter() - start
                console.print(f"  round {round_no + 1} {mode}: done", highlight=False)
    return [summarize(mode, shots[mode], walls[mode]) for mode in modes]


def summarize(mode: str, shots: list[Shot], wall_s: float) -> ModeResult:
    ok = [s for s in shots if s.ok]
    ttfp = [s.ttfp_ms / 1000 for s in ok if s.ttfp_ms is not None]
    return ModeResult(
        mode=mode,
        requests=len(shots),
        failures=len(shots) - len(ok),
        wall_s=wall_s,
        images_per_s=len(ok) / wall_s if wall_s > 0 else 0.0,
        p50_ms=percentile_ms([s.latency_s for s in ok], 50),
        p95_ms=percentile_ms([s.latency_s for s in ok], 95),
        ttfp_p50_ms=percentile_ms(ttfp, 50),
        ttfp_p95_ms=percentile_ms(ttfp, 95),
        batch_sizes=sorted({s.batch_requests for s in ok if s.batch_requests is not None}),
        errors=sorted({s.error for s in shots if not s.ok})[:5],
    )


# --- report ----------------------------------------------------------------------------


def ratio_of(results: list[ModeResult]) -> float:
    by_mode = {r.mode: r for r in results}
    base = by_mode["one at a time"].images_per_s
    return by_mode["batched"].images_per_s / base if base > 0 else float("nan")


def service_vs_direct(results: list[ModeResult]) -> dict[str, float]:
    """A lone request through mmq over the same call in process: p50 ratio, ms added."""
    by_mode = {r.mode: r for r in results}
    service, direct = by_mode["one at a time"], by_mode[DIRECT]
    return {"p50": service.p50_ms / direct.p50_ms, "p50_added_ms": service.p50_ms - direct.p50_ms}


def print_report(args: argparse.Namespace, results: list[ModeResult], ratio: float) -> None:
    title = (
        f"{args.requests} image requests, {args.model} {args.size}x{args.size}, "
        f"{args.steps} steps, {args.device}"
    )
    table = Table(title=title)
    for column in ("mode", "images/s", "p50 ms", "p95 ms", "TTFP p50", "TTFP p95", "batches"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for r in results:
        table.add_row(
            r.mode,
            f"{r.images_per_s:.2f}",
            f"{r.p50_ms:,.0f}",
            f"{r.p95_ms:,.0f}",
            f"{r.ttfp_p50_ms:,.0f}",
            f"{r.ttfp_p95_ms:,.0f}",
            ",".join(map(str, r.batch_sizes)),
            style="red" if r.failures else None,
        )
    console.print(table)
    met = "[green]met[/green]" if ratio >= GOAL_RATIO else "[red]not met[/red]"
    console.print(f"batched / one at a time: {ratio:.2f}x images/s (goal >= {GOAL_RATIO}x: {met})")
    lone = service_vs_direct(results)
    console.print(
        f"one at a time through mmq / diffusers in process: {lone['p50']:.2f}x p50 "
        f"({lone['p50_added_ms']:+.0f} ms)"
    )
    for r in results:
        for error in r.errors:
            console.print(f"[red]{r.mode}: {error}[/red]")


def meta(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        **{k: getattr(args, k) for k in ("model", "device", "dtype", "size", "steps")},
        **{k: getattr(args, k) for k in ("scheduler", "requests", "rounds", "compile")},
        "max_wait_ms": args.max_wait_ms,
    }


def write_json(args: argparse.Namespace, results: list[ModeResult], ratio: float) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta(args),
        "goal": {"batched_over_one_at_a_time_min": GOAL_RATIO},
        "ratio": ratio,
        "goal_met": ratio >= GOAL_RATIO,
        "service_vs_direct": service_vs_direct(results),
        "results": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(jsonable(payload), indent=2) + "\n")
    console.print(f"results written to {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with ExitStack() as stack:
            model = model_path(args, stack)
            dep = stack.enter_context(deploy(args, model))
            results = asyncio.run(run_modes(dep.base_url, args, Direct(model, args)))
            dep.check_alive()
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[red]bench failed: {exc}[/red]")
        return 1
    ratio = ratio_of(results)
    print_report(args, results, ratio)
    write_json(args, results, ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
