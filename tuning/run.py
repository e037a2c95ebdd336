"""`mmq tune PIPELINE`: everything checked first (pipeline, SLOs, knobs, workload), then
a private deployment, the search, and the report."""

from __future__ import annotations

import asyncio
import datetime
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import JsonValue
from rich.console import Console

from jobs.settings import (
    DEFAULT_CONFIG_FILE,
    PipelineConfig,
    Settings,
    config_file_path,
    load_settings,
)
from tuning import report
from tuning.deploy import CandidateFailed, TuneDeployment, read_config
from tuning.measure import Measurement, UsageProbe, run_level
from tuning.search import Outcome, Stats, Tuner
from tuning.slo import Slo, SloError, check_kind, parse_duration_ms, parse_slo
from tuning.space import Candidate, KnobError, Space, apply, build_space, key, parse_assignment
from tuning.workload import (
    UPLOAD_PREFIX,
    BuiltIn,
    Level,
    Workload,
    WorkloadError,
    built_in,
    from_file,
    from_inputs,
    levels,
)


class TuneError(ValueError):
    """Bad input to `mmq tune`: said before anything starts."""


@dataclass
class TuneArgs:
    pipeline: str
    config: Path | None = None
    slos: list[str] = field(default_factory=list)
    workload: Path | None = None
    inputs: list[str] = field(default_factory=list)
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    rates: list[float] = field(default_factory=list)
    replay: list[float] = field(default_factory=list)
    """Speed-ups of a recorded workload's own arrivals (instead of the levels above)."""
    requests: int | None = None
    knobs: list[str] = field(default_factory=list)
    fix: list[str] = field(default_factory=list)
    budget: str = "20m"
    exhaustive: bool = False
    repeats: int = 2
    seed: int = 0
    warmup: int = 2
    out: Path | None = None
    write: bool = False
    start_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    builtin: BuiltIn = field(default_factory=BuiltIn)


@dataclass
class Plan:
    args: TuneArgs
    config_path: Path | None
    settings: Settings
    pipeline: PipelineConfig
    slos: list[Slo]
    space: Space
    levels: list[Level]
    budget_s: float


def plan(args: TuneArgs) -> Plan:
    """Every check that needs no process: raises TuneError with what is wrong."""
    config_path = config_file_path(args.config)
    try:
        settings = load_settings(config_path)
    except (FileNotFoundError, ValueError) as exc:
        raise TuneError(f"config: {exc}") from None
    if args.pipeline not in settings.pipelines:
        names = ", ".join(sorted(settings.pipelines)) or "none"
        raise TuneError(f"unknown pipeline {args.pipeline!r}; the config has: {names}")
    pipeline = settings.pipelines[args.pipeline]
    if not args.slos:
        raise TuneError("give at least one --slo (e.g. --slo p99=2s)")
    try:
        slos = [parse_slo(text) for text in args.slos]
        check_kind(slos, pipeline.kind)
        budget_s = parse_duration_ms(args.budget, "--budget") / 1000
        widen = dict(parse_assignment(text, many=True) for text in args.knobs)
        fix = {
            name: values[0] for name, values in (parse_assignment(t, many=False) for t in args.fix)
        }
        space = build_space(pipeline.kind, pipeline, widen, fix)
    except (SloError, KnobError) as exc:
        raise TuneError(str(exc)) from None
    if args.repeats < 1:
        raise TuneError("--repeats must be at least 1")
    if any(c < 1 for c in args.concurrency) or any(r <= 0 for r in args.rates + args.replay):
        raise TuneError("--concurrency levels must be >= 1, --rate and --replay levels > 0")
    if args.replay and (args.rates or args.workload is None):
        raise TuneError("--replay replays a --workload file that mmq record wrote, not --rate")
    return Plan(
        args, config_path, settings, pipeline, slos, space,
        levels(args.concurrency, args.rates, args.requests), budget_s,
    )  # fmt: skip


def workload_of(p: Plan, workdir: Path) -> Workload:
    args, kind = p.args, p.pipeline.kind
    try:
        if args.workload is not None:
            return from_file(args.workload, kind, p.settings)
        if args.inputs:
            return from_inputs(args.inputs, kind, p.settings)
        return built_in(kind, p.settings, args.builtin, workdir)
    except WorkloadError as exc:
        raise TuneError(str(exc)) from None


def run(args: TuneArgs, console: Console) -> int:
    p = plan(args)
    out = args.out or Path("tune-results") / f"{args.pipeline}-{_stamp()}"
    with tempfile.TemporaryDirectory(prefix="mmq-tune-") as tmp:
        workdir = Path(tmp)
        workload = workload_of(p, workdir)
        if args.replay:
            if workload.arrivals is None:
                raise TuneError(
                    f'--replay: {args.workload} has no arrival times ("at" on every line, '
                    "as mmq record writes)"
                )
            p.levels = levels([], [], args.requests, args.replay, workload.arrivals)
        console.print(
            f"tuning {args.pipeline} ({p.pipeline.kind}): {len(p.space.knobs)} knob(s), "
            f"{p.space.size} point(s) in the space; SLO {', '.join(map(str, p.slos))}; "
            f"workload {workload.describe}; levels {', '.join(map(str, p.levels))}",
            highlight=False,
        )
        for note in p.space.notes:
            console.print(f"note: {note}", highlight=False)
        raw = read_config(p.config_path)
        with TuneDeployment(raw, args.pipeline, workdir) as deployment:
            inputs = _uploaded(deployment, workload)
            outcome = _search(p, deployment, inputs, console)
        _keep_logs(workdir, out / "logs")
    report.print_all(console, outcome, p.slos)
    _save(p, outcome, out, console)
    return 0 if outcome.best is not None else 1


def _search(
    p: Plan, deployment: TuneDeployment, inputs: list[dict[str, JsonValue]], console: Console
) -> Outcome:
    started = time.monotonic()
    follow = "concurrency" not in p.space.knobs

    def measure(candidate: Candidate, repeat: int) -> Measurement:
        return measure_candidate(p, deployment, inputs, candidate, repeat, follow)

    with console.status("starting...") as status:

        def progress(line: str, best: Stats | None) -> None:
            elapsed = time.monotonic() - started
            leader = (
                f"best so far {key(best.knobs)}: {best.median:.2f}/s" if best else "no result yet"
            )
            text = f"{line} | {elapsed / 60:.1f} of {p.budget_s / 60:.0f} min | {leader}"
            status.update(text)
            if not console.is_terminal and line.startswith("measured"):
                console.print(text, highlight=False)  # a log gets a line per run

        tuner = Tuner(
            p.space, measure, repeats=p.args.repeats, budget_s=p.budget_s,
            exhaustive=p.args.exhaustive, progress=progress,
        )  # fmt: skip
        return tuner.run()


def measure_candidate(
    p: Plan,
    deployment: TuneDeployment,
    inputs: list[dict[str, JsonValue]],
    candidate: Candidate,
    repeat: int,
    follow: bool,
) -> Measurement:
    """Start the candidate's workers, warm them up, run the levels (lightest first, until
    one breaks the SLOs), stop the workers."""
    result = Measurement(dict(candidate), repeat)
    config = apply(p.pipeline, candidate, follow)
    label = f"c{abs(hash((key(candidate), repeat))) % 10**8}"
    try:
        workers = deployment.start_workers(label, config, p.args.start_timeout_s)
    except CandidateFailed as exc:
        result.failed = str(exc)
        return result
    result.start_s = workers.start_s
    kind, seed = p.pipeline.kind, p.args.seed
    try:
        if p.args.warmup:
            warm = Level(concurrency=1, requests=p.args.warmup)
            asyncio.run(
                run_level(
                    deployment.base_url, kind, inputs, warm, [], seed, p.args.request_timeout_s
                )
            )
        with UsageProbe(workers.pids, config.device) as probe:
            for level in p.levels:
                done = asyncio.run(
                    run_level(
                        deployment.base_url,
                        kind,
                        inputs,
                        level,
                        p.slos,
                        seed,
                        p.args.request_timeout_s,
                    )
                )
                result.levels.append(done)
                if not done.sustained:
                    break
        result.usage = probe.usage()
        dead = [w for w in deployment.workers if not w.alive()]
        if dead:
            result.failed = f"a worker died during the run (exit {dead[0].process.returncode})"
    finally:
        deployment.stop_workers()
    return result


def _uploaded(deployment: TuneDeployment, workload: Workload) -> list[dict[str, JsonValue]]:
    """The inputs with each `@file` replaced by the key of its upload."""
    keys: dict[str, str] = {}
    with httpx.Client(base_url=deployment.base_url, timeout=120) as client:
        for token, path in workload.uploads.items():
            keys[token] = deployment.upload(client, path)
    return [
        {
            k: keys.get(v[1:], v) if isinstance(v, str) and v.startswith(UPLOAD_PREFIX) else v
            for k, v in job.items()
        }
        for job in workload.inputs
    ]


def _save(p: Plan, outcome: Outcome, out: Path, console: Console) -> None:
    meta: report.TuneMeta = {
        "pipeline": p.args.pipeline,
        "kind": p.pipeline.kind,
        "slos": [str(s) for s in p.slos],
        "levels": [str(lv) for lv in p.levels],
        "space": p.space.knobs,
        "repeats": p.args.repeats,
        "seed": p.args.seed,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
    report.write_json(out / "tune.json", report.to_json(outcome, meta))
    png = report.plot(outcome, out / "tune.png")
    console.print(f"results: {out / 'tune.json'}" + (f", {png}" if png else ""), highlight=False)
    if outcome.winner is None:
        return
    path = p.config_path or DEFAULT_CONFIG_FILE
    old = path.read_text() if path.exists() else ""
    new = report.config_change(old, p.args.pipeline, outcome.winner.knobs)
    if p.args.write:
        path.write_text(new)
        console.print(f"wrote the winner's knobs to {path}", highlight=False)
    else:
        console.print(
            report.diff(old, new, path) or "no change to the config", highlight=False, markup=False
        )
        console.print("(--write applies it)")


def _keep_logs(workdir: Path, logs: Path) -> None:
    """The processes' logs, and each engine's (an LLM candidate's: its command line and
    start), from the work directory that is about to go."""
    found = [*workdir.glob("*.log"), *(workdir / "data" / "engine-logs").glob("*.log")]
    if found:
        logs.mkdir(parents=True, exist_ok=True)
    for log in found:
        shutil.copyfile(log, logs / log.name)


def _stamp() -> str:
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
