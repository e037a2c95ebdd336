"""What mmq exists for, measured on one device in one run: batching, instances, engines.

    python -m bench.gpu [--device cuda|cpu] [--quick] [--sections asr,image,tts,llm]
                        [--out-dir bench/results] [--models-dir DIR] [--vllm-bin PATH]
                        [--set KEY=VALUE ...] [--asr-audio FILE] [--build-only]
    python -m bench.gpu --write-asr-audio FILE

It starts its own deployment (a private Redis, the API, and workers section by section,
as the other benches do) and measures, on the same device:

- asr:   mmq's cross-request batched decoding vs one request at a time (audio-s/s,
         p50/p99, first segment), and faster-whisper's `BatchedInferencePipeline` in
         process (`bench/gpu_asr.py`);
- image: the same requests batched vs one at a time, 512x512 on a GPU (`gpu_image.py`);
- tts:   1, 2 and 4 instances on one device, Coqui VITS and Piper (`gpu_tts.py`);
- llm:   the service vs its engine called directly (TTFT, end to end, tokens/s), with
         `transformers serve`, and `vllm serve` where it is installed (`gpu_llm.py`);

and for each the device's utilisation and memory while it runs (NVML on a GPU; the CPU's
share of busy time on a CPU), and the time to load and warm each model. Models are built
from configs with random weights (`gpu_models.py`): the real models' compute and memory
on a GPU, tiny ones on the CPU. It writes gpu.md, gpu.json and gpu-util.png to
`--out-dir` (default bench/results, or $OUT where set).

`--quick` sends fewer requests and starts the sections' workers at once, each as soon
as its model is built, and measures once all have loaded: with
`--device cpu` it is the CI smoke run (tests/test_bench_gpu.py); with `--device cuda` a
short check of a GPU host. `--device cuda` where NVML finds no GPU stops at once.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import traceback
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.gpu_asr import AsrSection, clip
from bench.gpu_common import (
    Context,
    Plan,
    Section,
    SectionResult,
    group_key,
    make_plan,
    override,
)
from bench.gpu_deploy import Deployment
from bench.gpu_image import ImageSection
from bench.gpu_llm import LlmSection, vllm_bin
from bench.gpu_models import Models, build, plan_models
from bench.gpu_nvml import NvmlProbe, Sampler, make_probe, nvml_reason
from bench.gpu_report import write
from bench.gpu_tts import TtsSection

SECTIONS = ("asr", "image", "tts", "llm")
ENV = {
    "MMQ_LIMITS__IMAGE_MAX_SIDE": "1024",
    "MMQ_LIMITS__IMAGE_MAX_STEPS": "100",
    "MMQ_LIMITS__TEXT_MAX_CHARS": "5000",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="fewer requests (CI, smoke)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    default_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path("bench/results")
    parser.add_argument("--out-dir", type=Path, default=default_out)
    parser.add_argument("--models-dir", type=Path, help="where models are built and kept")
    parser.add_argument("--vllm-bin", help="`vllm` executable (default: on PATH)")
    parser.add_argument(
        "--asr-audio",
        default="",
        help="the ASR clip as an mp3, made ahead with --write-asr-audio (for a host without "
        "Piper, the voice that speaks it)",
    )
    parser.add_argument(
        "--write-asr-audio",
        type=Path,
        metavar="FILE",
        help="write the ASR clip --device would use to FILE (mp3) and exit",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one field of the plan (bench/gpu_common.py Plan), e.g. asr_requests=8 "
        "or tts_instances=1,2,4; repeatable",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="build the sections' models into --models-dir and exit: a run started meanwhile "
        "waits for a model being built, then uses it",
    )
    args = parser.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; choose from {list(SECTIONS)}")
    args.models_dir = args.models_dir or Path(tempfile.gettempdir()) / f"mmq-bench-{args.device}"
    return args


def sections_of(args: argparse.Namespace) -> list[Section]:
    every: dict[str, Section] = {
        "asr": AsrSection(),
        "image": ImageSection(),
        "tts": TtsSection(),
        "llm": LlmSection(vllm_bin(args.vllm_bin)),
    }
    return [every[name] for name in args.sections]


def run(
    args: argparse.Namespace, plan: Plan, sampler: Sampler
) -> tuple[Models, list[SectionResult], list[dict[str, Any]]]:
    sections = sections_of(args)
    models = plan_models(plan, args.models_dir, _free_gib(sampler))
    results: list[SectionResult] = []
    with ExitStack() as stack:
        pipelines: dict[str, dict[str, Any]] = {}
        for section in sections:
            pipelines |= section.pipelines(plan, models)
        ctx = Context(plan, Deployment(stack, pipelines, ENV), sampler, models)
        for section in sections:
            with sampler.phase("building models"):
                build(models, section.name)
            if plan.quick:  # its workers load while the next model builds
                instances, first = section.groups(plan)[0]
                group = ctx.deployment.start(instances, first)
                ctx.prestarted[group_key(instances, first)] = group
        ctx.deployment.wait_api()
        with sampler.phase("loading"):
            for key, group in list(ctx.prestarted.items()):
                try:
                    ctx.deployment.wait_loaded(group)
                except RuntimeError as exc:  # its section fails; the others run
                    print(f"bench.gpu: {key} failed to load: {exc}", file=sys.stderr)
                    ctx.failed_starts[key] = str(exc)[:2000]
                    ctx.deployment.stop(ctx.prestarted.pop(key))
        for section in sections:
            print(f"bench.gpu: {section.name} at {sampler.now_s():.0f} s", flush=True)
            try:
                results.append(section.run(ctx))
            except Exception as exc:  # one section's failure is reported, the rest runs
                traceback.print_exc()
                results.append(SectionResult(section.name, skipped=f"failed: {exc!r}"[:500]))
    return models, results, ctx.checks


def _free_gib(sampler: Sampler) -> float:
    probe = sampler.probe
    return (probe.total_mib - probe.read()[1]) / 1024 if isinstance(probe, NvmlProbe) else 0.0


def meta(args: argparse.Namespace, plan: Plan, sampler: Sampler, models: Models) -> dict[str, Any]:
    gpu = plan.device == "cuda"
    return {
        "command": "python -m bench.gpu " + " ".join(sys.argv[1:]),
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device_name": sampler.probe.name,
        "mode": f"{'quick' if plan.quick else 'full'} run on the {'GPU' if gpu else 'CPU'}",
        "plan": plan.__dict__,
        "models": models.labels,
        "builds": models.builds,
        "cpu_count": os.cpu_count(),
        "busy_note": (
            "busy %: NVML's utilization rate (share of time a kernel ran), sampled every 0.2 s; "
            "the goal under load is over 80 %. mem MiB: the whole GPU's memory in use."
            if gpu
            else "CPU run: busy % is the share of all cores not idle (/proc/stat) and mem MiB "
            "the host's RAM in use; GPU-only measures (NVML, GPU memory per worker, vLLM) "
            "need --device cuda and show as -."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_asr_audio:  # no device needed: the clip is spoken on the CPU
        args.write_asr_audio.write_bytes(clip(make_plan(args.device, args.quick)))
        print(f"wrote {args.write_asr_audio}")
        return 0
    if args.device == "cuda" and (reason := nvml_reason()):
        print(
            f"bench.gpu: --device cuda, but {reason}. Run it on a GPU host, or "
            "`python -m bench.gpu --device cpu --quick` here.",
            file=sys.stderr,
        )
        return 2
    try:
        plan = override(make_plan(args.device, args.quick, args.asr_audio), args.set)
    except ValueError as exc:
        print(f"bench.gpu: {exc}", file=sys.stderr)
        return 2
    sampler = Sampler(make_probe(args.device))
    if args.build_only:
        models = plan_models(plan, args.models_dir, _free_gib(sampler))
        for section in sections_of(args):
            build(models, section.name)
        print(f"bench.gpu: built {models.builds} in {args.models_dir}")
        return 0
    sampler.start()
    try:
        models, results, checks = run(args, plan, sampler)
    finally:
        sampler.stop()
    paths = write(
        args.out_dir, meta(args, plan, sampler, models) | {"checks": checks}, results, sampler
    )
    print(paths["md"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    failed = [r.name for r in results if r.skipped.startswith("failed")]
    if failed:
        print(f"bench.gpu: sections failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
