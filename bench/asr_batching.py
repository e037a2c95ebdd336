"""ASR throughput and first-segment latency, cross-request batching on and off, one run.

    python -m bench.asr_batching [--audio FILE] [--concurrency 1,8] [--rounds 1]
                                 [--modes alone,batched,parallel,hybrid]
                                 [--out bench/results/asr_batching.json]

Starts its own deployment (Redis, the API, one ASR worker per mode) with one pipeline per
mode, all on the same model (default: the packaged tiny.en, int8 on CPU):

- alone:    one request at a time (max_batch 1, runners 1): batching off;
- batched:  lockstep batches of up to 8 requests, one window of each per forward pass;
- parallel: two requests decoded at once, each alone (runners 2, num_workers 2, so
            each call gets half the cores): the CPU way;
- hybrid:   lockstep batches of up to 4, two at once.

Each request uploads nothing (the audio is uploaded once), submits an `asr` job and
follows its events over SSE like any client: first-segment latency is the first
`partial` event, full latency the terminal one. Each round runs every concurrency level
for every mode in turn (`concurrency` closed-loop lanes, `max(2, concurrency)` requests);
the modes take turns so that a busy shared machine slows them alike. Goals (CPU): batching at
8 concurrent >= 1.3x the audio-seconds per second of `alone`; first segment <= 30 % of
the full time. The default audio is 60 s of Piper speech (the test voice).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_level
from bench.overhead import jsonable
from tuning.deployment import private_deployment
from tuning.load import run_job

DEFAULT_OUT = Path("bench/results/asr_batching.json")
THROUGHPUT_GOAL = 1.3
FIRST_SHARE_GOAL = 0.3
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1"}
MODES: dict[str, dict[str, Any]] = {
    "alone": {"max_batch": 1, "runners": 1, "options": {}},
    "batched": {"max_batch": 8, "runners": 1, "max_wait_ms": 50, "options": {}},
    "parallel": {"max_batch": 1, "runners": 2, "options": {"num_workers": 2}},
    "hybrid": {"max_batch": 4, "runners": 2, "max_wait_ms": 50, "options": {"num_workers": 2}},
}
console = Console(width=120)


@dataclass
class Sample:
    """One request: when its first segment and its end came, and its text."""

    first_s: float | None = None
    total_s: float | None = None
    text: str = ""
    error: str | None = None


@dataclass
class Level:
    mode: str
    concurrency: int
    requests: int
    completed: int
    wall_s: float
    audio_s_per_s: float
    first_p50_ms: float
    total_p50_ms: float
    first_share: float
    """Median over requests of first-segment time / full time."""
    text_equals_alone: bool | None
    errors: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.asr_batching", description=__doc__)
    parser.add_argument("--audio", type=Path, help="audio file (default: 60 s of Piper speech)")
    parser.add_argument("--model", default="", help="hub id or CTranslate2 dir (default tiny.en)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.modes = [m for m in args.modes.split(",") if m]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {list(MODES)}")
    return args


def config_toml(args: argparse.Namespace) -> str:
    tables = []
    for mode in args.modes:
        knobs = MODES[mode]
        lines = [f"[pipelines.asr_{mode}]", 'kind = "asr"', 'impl = "pipelines.asr:AsrPipeline"']
        lines += [f"model = {json.dumps(args.model)}", f"device = {json.dumps(args.device)}"]
        lines += [f"{k} = {v}" for k, v in knobs.items() if k != "options"]
        lines += ["concurrency = 16", f"[pipelines.asr_{mode}.options]"]
        lines += [f"{k} = {v}" for k, v in knobs["options"].items()]
        tables.append("\n".join(lines))
    return "\n\n".join(tables) + "\n"


def load_audio(args: argparse.Namespace) -> tuple[bytes, str, str | None]:
    """The audio, its file name and its reference text (None for `--audio`)."""
    if args.audio:
        return args.audio.read_bytes(), args.audio.name, None
    from harness.audio import LONG, reference, spoken

    return spoken(LONG, "mp3"), "meeting.mp3", reference(LONG)


async def transcribe(client: httpx.AsyncClient, key: str, pipeline: str) -> Sample:
    inp = {"audio": key, "model": pipeline, "language": "en"}
    trace = await run_job(client, "asr", inp)
    text = str(trace.output.get("text", ""))
    return Sample(first_s=trace.first_s, total_s=trace.total_s, text=text, error=trace.error)


async def measure(
    api_url: str, key: str, mode: str, concurrency: int, requests: int
) -> tuple[list[Sample], float]:
    """`requests` transcriptions over `concurrency` closed-loop lanes; samples, wall time."""
    samples: list[Sample] = []
    async with httpx.AsyncClient(base_url=api_url, timeout=600, trust_env=False) as client:

        async def call() -> str | None:
            sample = await transcribe(client, key, f"asr_{mode}")
            samples.append(sample)
            return sample.error

        _, wall_s = await run_level(call, requests, concurrency)
    return samples, wall_s


def summarize(
    mode: str, concurrency: int, samples: list[Sample], wall_s: float, duration_s: float
) -> Level:
    ok = [s for s in samples if s.error is None and s.first_s and s.total_s]
    return Level(
        mode=mode,
        concurrency=concurrency,
        requests=len(samples),
        completed=len(ok),
        wall_s=wall_s,
        audio_s_per_s=len(ok) * duration_s / wall_s,
        first_p50_ms=percentile_ms([s.first_s for s in ok if s.first_s], 50),
        total_p50_ms=percentile_ms([s.total_s for s in ok if s.total_s], 50),
        first_share=_median_share(ok),
        text_equals_alone=None,
        errors=[s.error for s in samples if s.error][:5],
    )


def _median_share(samples: list[Sample]) -> float:
    shares = [s.first_s / s.total_s for s in samples if s.first_s and s.total_s]
    return statistics.median(shares) if shares else float("nan")


# --- deployment ------------------------------------------------------------------------


def upload(api_url: str, data: bytes, name: str) -> str:
    files = {"file": (name, data, "application/octet-stream")}
    r = httpx.post(f"{api_url}/v1/files", files=files, timeout=60, trust_env=False)
    r.raise_for_status()
    return str(r.json()["key"])


async def warm_up(api_url: str, key: str, modes: list[str]) -> None:
    """One job on each mode's worker before anything is measured."""
    async with httpx.AsyncClient(base_url=api_url, timeout=600, trust_env=False) as client:
        for mode in modes:
            if error := (await transcribe(client, key, f"asr_{mode}")).error:
                raise RuntimeError(f"the {mode} worker's warm-up failed: {error}")


# --- report ----------------------------------------------------------------------------


def ratios(levels: list[Level]) -> dict[str, Any]:
    by = {(lv.mode, lv.concurrency): lv for lv in levels}
    top = max(lv.concurrency for lv in levels)
    base = by.get(("alone", top))
    out: dict[str, Any] = {"concurrency": top}
    for lv in levels:
        if lv.concurrency == top and base and lv.mode != "alone":
            out[f"{lv.mode}_vs_alone"] = lv.audio_s_per_s / base.audio_s_per_s
        if lv.concurrency == 1:
            out[f"{lv.mode}_first_share_c1"] = lv.first_share
    return out


def table(levels: list[Level]) -> Table:
    t = Table(title="ASR: audio-seconds per second, first segment vs full time")
    for col in ("mode", "conc", "req", "audio-s/s", "x alone", "first p50", "full p50"):
        t.add_column(col, justify="right")
    t.add_column("first/full", justify="right")
    t.add_column("text == alone", justify="right")
    base = {lv.concurrency: lv.audio_s_per_s for lv in levels if lv.mode == "alone"}
    for lv in levels:
        x = lv.audio_s_per_s / base[lv.concurrency] if base.get(lv.concurrency) else float("nan")
        t.add_row(
            lv.mode, str(lv.concurrency), f"{lv.completed}/{lv.requests}",
            f"{lv.audio_s_per_s:.1f}", f"{x:.2f}", f"{lv.first_p50_ms:.0f} ms",
            f"{lv.total_p50_ms:.0f} ms", f"{lv.first_share:.0%}", str(lv.text_equals_alone),
        )  # fmt: skip
    return t


def run(args: argparse.Namespace) -> dict[str, Any]:
    from harness.audio import silence, wer

    audio, name, reference = load_audio(args)
    duration_s = _duration(audio)
    runs: dict[tuple[str, int], tuple[list[Sample], float]] = {}
    # One worker per mode, all running (idle ones cost nothing): the modes take turns and
    # share whatever else the machine is doing.
    with private_deployment(
        config_toml(args), ENV, [f"asr_{mode}" for mode in args.modes], "mmq-asr-",
        test_pipelines=False, reaper=False, worker_timeout_s=180,
    ) as dep:  # fmt: skip
        url = dep.base_url
        key, warmup = upload(url, audio, name), upload(url, silence(2.0), "warmup.wav")
        asyncio.run(warm_up(url, warmup, args.modes))
        for round_no in range(args.rounds):
            for concurrency in args.concurrency:
                for mode in args.modes:  # modes take turns: load drift hits them alike
                    requests = max(2, concurrency)
                    got, wall_s = asyncio.run(measure(url, key, mode, concurrency, requests))
                    before, before_s = runs.get((mode, concurrency), ([], 0.0))
                    runs[(mode, concurrency)] = (before + got, before_s + wall_s)
                    level = summarize(mode, concurrency, got, wall_s, duration_s)
                    console.print(f"round {round_no + 1}: {_line(level)}")
    levels = [summarize(m, c, got, wall, duration_s) for (m, c), (got, wall) in runs.items()]
    alone_text = _alone_text(runs)
    for level in levels:
        texts = {s.text for s in runs[(level.mode, level.concurrency)][0] if s.error is None}
        level.text_equals_alone = texts == {alone_text} if alone_text is not None else None
    levels.sort(key=lambda lv: (lv.concurrency, args.modes.index(lv.mode)))
    return {
        "audio": {"name": name, "duration_s": duration_s},
        "wer_alone": wer(reference, alone_text) if reference and alone_text else None,
        "goals": {"throughput_ratio_min": THROUGHPUT_GOAL, "first_share_max": FIRST_SHARE_GOAL},
        "ratios": ratios(levels),
        "levels": [asdict(lv) for lv in levels],
        "argv": sys.argv[1:],
    }


def _alone_text(runs: dict[tuple[str, int], tuple[list[Sample], float]]) -> str | None:
    texts = [s.text for (m, _), (got, _) in runs.items() if m == "alone" for s in got if s.text]
    return texts[0] if texts else None


def _line(lv: Level) -> str:
    return (
        f"{lv.mode} x{lv.concurrency}: {lv.audio_s_per_s:.1f} audio-s/s, first "
        f"{lv.first_p50_ms:.0f} ms of {lv.total_p50_ms:.0f} ms ({lv.first_share:.0%})"
    )


def _duration(audio: bytes) -> float:
    import io

    import av

    with av.open(io.BytesIO(audio), mode="r") as container:
        return float(container.duration or 0) / av.time_base


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(jsonable(result), indent=2) + "\n")
    levels = [Level(**lv) for lv in result["levels"]]
    console.print(table(levels))
    console.print(json.dumps(jsonable(result["ratios"]), indent=2))
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
