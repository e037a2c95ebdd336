"""`mmq tune PIPELINE` and `mmq record FILE`: the command lines of `tuning.run` and
`tuning.record` (imported when they run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{what}: {text!r} is not a comma-separated list of numbers"
        ) from None


def tune(
    pipeline: Annotated[str, typer.Argument(help="Pipeline name from the config")],
    slo: Annotated[
        list[str] | None,
        typer.Option(help="p99=2s, ttft_p99=500ms, tpot_p50=50ms, first_audio_p95=300ms, ..."),
    ] = None,
    workload: Annotated[
        Path | None, typer.Option(help="JSONL of jobs (an input a line; audio as @file)")
    ] = None,
    input: Annotated[
        list[str] | None, typer.Option("--input", help="One job's input as JSON")
    ] = None,
    concurrency: Annotated[str, typer.Option(help="Closed-loop levels")] = "1,2,4,8",
    rate: Annotated[str | None, typer.Option(help="Poisson levels, requests/s (instead)")] = None,
    replay: Annotated[
        str | None,
        typer.Option(help="Replay a recorded --workload's arrivals at these speed-ups (1,2,4)"),
    ] = None,
    requests: Annotated[int | None, typer.Option(min=1, help="Requests per level")] = None,
    knob: Annotated[list[str] | None, typer.Option(help="NAME=V1,V2,... values to try")] = None,
    fix: Annotated[list[str] | None, typer.Option(help="NAME=V: keep this knob at V")] = None,
    budget: Annotated[str, typer.Option(help="Time budget (20m, 90s)")] = "20m",
    exhaustive: Annotated[bool, typer.Option(help="Measure the whole grid")] = False,
    repeats: Annotated[int, typer.Option(min=1, help="Runs per candidate, taking turns")] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the job order and arrivals")] = 0,
    warmup: Annotated[int, typer.Option(min=0, help="Uncounted requests per candidate")] = 2,
    asr_seconds: Annotated[str, typer.Option(help="Built-in ASR clip lengths, s")] = "10",
    tts_sentences: Annotated[str, typer.Option(help="Built-in TTS text lengths")] = "3",
    llm_lengths: Annotated[str, typer.Option(help="Built-in LLM IN:OUT token lengths")] = "128:64",
    image: Annotated[str, typer.Option(help="Built-in images WxH@STEPS")] = "512x512@20",
    start_timeout: Annotated[
        float, typer.Option(help="Seconds a candidate may take to start")
    ] = 600,
    out: Annotated[Path | None, typer.Option(help="Directory for tune.json and tune.png")] = None,
    write: Annotated[bool, typer.Option(help="Write the winner's knobs into the config")] = False,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config")] = None,
) -> None:
    """Find the pipeline's best knobs under latency SLOs, on this machine, with your jobs:
    goodput (requests/s meeting every SLO) of each candidate, against the current config."""
    from rich.console import Console

    from tuning.run import TuneArgs, TuneError, run
    from tuning.workload import BuiltIn

    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        built = BuiltIn(
            asr_seconds=_floats(asr_seconds, "--asr-seconds"),
            tts_sentences=[int(v) for v in _floats(tts_sentences, "--tts-sentences")],
            llm_lengths=[_pair(v) for v in llm_lengths.split(",")],
            image_shapes=[_shape(v) for v in image.split(",")],
        )
        args = TuneArgs(
            pipeline=pipeline, config=config, slos=slo or [], workload=workload,
            inputs=input or [], concurrency=[int(v) for v in _floats(concurrency, "--concurrency")],
            rates=_floats(rate, "--rate") if rate else [],
            replay=_floats(replay, "--replay") if replay else [], requests=requests,
            knobs=knob or [], fix=fix or [], budget=budget, exhaustive=exhaustive,
            repeats=repeats, seed=seed, warmup=warmup, out=out, write=write,
            start_timeout_s=start_timeout, builtin=built,
        )  # fmt: skip
        code = run(args, console)
    except TuneError as exc:
        console.print(f"[red]mmq tune[/]: {exc}", highlight=False)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _pair(text: str) -> tuple[int, int]:
    first, sep, second = text.partition(":")
    if not (sep and first.isdigit() and second.isdigit()):
        raise typer.BadParameter(f"--llm-lengths: {text!r} is not IN:OUT (e.g. 128:64)")
    return int(first), int(second)


def _shape(text: str) -> tuple[int, int, int]:
    size, sep, steps = text.partition("@")
    width, x, height = size.partition("x")
    if not (sep and x and width.isdigit() and height.isdigit() and steps.isdigit()):
        raise typer.BadParameter(f"--image: {text!r} is not WxH@STEPS (e.g. 512x512@20)")
    return int(width), int(height), int(steps)


def record(
    out: Annotated[Path, typer.Argument(help="JSONL file to append the jobs to")],
    kind: Annotated[str | None, typer.Option(help="Only jobs of this kind")] = None,
    pipeline: Annotated[str | None, typer.Option(help="Only jobs of this pipeline")] = None,
    duration: Annotated[
        str | None, typer.Option(help="Stop after this long (10m, 90s; default: Ctrl-C)")
    ] = None,
    jobs: Annotated[int | None, typer.Option(min=1, help="Stop after this many jobs")] = None,
    redis: Annotated[str | None, typer.Option("--redis", help="Redis URL")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config")] = None,
) -> None:
    """Record the jobs a running deployment accepts, as a workload for `mmq tune
    --workload FILE` (with `--replay` to send them at their recorded pace). Input files
    are copied beside FILE. Job inputs are your users' data: FILE is written mode 0600."""
    from rich.console import Console

    from mmq.settings import command_settings, with_redis
    from tuning.record import RecordedLine
    from tuning.record import record as run_record
    from tuning.slo import SloError, parse_duration_ms

    console = Console(stderr=True)
    try:
        duration_s = parse_duration_ms(duration, "--duration") / 1000 if duration else None
    except SloError as exc:
        raise typer.BadParameter(str(exc)) from None
    settings = with_redis(command_settings(config, redis))
    if kind is None and pipeline is not None and pipeline in settings.pipelines:
        kind = settings.pipelines[pipeline].kind
    console.print(f"recording accepted jobs to {out} (Ctrl-C stops)", highlight=False)

    def said(line: RecordedLine) -> None:
        console.print(f"{line['at']:>8}s  {line['kind']}/{line['pipeline']}", highlight=False)

    done = run_record(
        settings, out, kind=kind, pipeline=pipeline, duration_s=duration_s,
        max_jobs=jobs, on_line=said,
    )  # fmt: skip
    for job_id, why in done.skipped.items():
        console.print(f"[yellow]not recorded[/] {job_id}: {why}", highlight=False)
    console.print(f"{done.written} job(s) written to {out}", highlight=False)
