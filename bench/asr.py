"""ASR beside the in-process baselines, at low and high load, in one run.

    python -m bench.asr [--audio FILE] [--concurrency 1,8,32] [--requests N] [--rounds 1]
                        [--config mmq.toml] [--out bench/results/asr.json]

Three targets transcribe the same clip (default: 9 s of Piper speech, the test voice) in
closed loops of `concurrency` lanes, taking turns level by level:

- `sequential`: faster-whisper in this process, one `WhisperModel` with every core
  (`cpu_threads` = cores, `num_workers` = 1), one call at a time (lanes wait their turn);
- `threads`: the same model called from `concurrency` threads at once;
- `mmq`: `POST /v1/audio/transcriptions` (multipart upload, `response_format=json`) on a
  private deployment (Redis, the API, the `asr` worker) with the shipped `mmq.toml`,
  unchanged.

All three decode with faster-whisper's defaults (beam 5) in English, on the same model
(`[pipelines.asr] model`: the packaged tiny.en unless the config names another) and
compute type. Per target and level: audio-seconds per second over the level's wall time,
p50/p99 end to end (send to answer, seen by the client), and the WER of every answer
against the script (mean and worst). Ratios, one run: mmq's p50 at concurrency 1 over
`sequential`'s (goal <= 1.1), and at the higher levels mmq's throughput over `threads`'
(goal >= 1.3) and its p99 over `threads`' (goal <= 0.7).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import REPO, percentile_ms, run_meta
from jobs.settings import load_settings
from tuning import load
from tuning.deployment import private_deployment

TARGETS = ("sequential", "threads", "mmq")
GOALS = {"c1_p50_vs_sequential_max": 1.1, "throughput_vs_threads_min": 1.3, "p99_max": 0.7}
console = Console(width=130)

Transcribe = Callable[[], str]
"""One request: returns the transcript (raises on failure)."""


@dataclass
class Level:
    target: str
    concurrency: int
    requests: int
    completed: int
    wall_s: float
    audio_s_per_s: float
    p50_ms: float
    p99_ms: float
    wer_mean: float | None
    wer_max: float | None
    errors: list[str] = field(default_factory=list)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.asr", description=__doc__)
    parser.add_argument("--audio", type=Path, help="audio file (default: 9 s of Piper speech)")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument(
        "--requests", type=int, default=0, help="per level (default: max(16, 2 x concurrency))"
    )
    parser.add_argument("--rounds", type=int, default=1, help="each level this many times")
    parser.add_argument("--config", type=Path, default=REPO / "mmq.toml")
    parser.add_argument("--out", type=Path, default=Path("bench/results/asr.json"))
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    return args


def load_audio(args: argparse.Namespace) -> tuple[bytes, str, str | None]:
    """The audio, its file name and the script (None for `--audio`)."""
    if args.audio:
        return args.audio.read_bytes(), args.audio.name, None
    from harness.audio import LONG, reference, spoken

    return spoken(LONG[:3], "wav"), "clip.wav", reference(LONG[:3])


# --- targets -------------------------------------------------------------------------


class InProcess:
    """faster-whisper as a user calls it: one model with every core."""

    def __init__(self, args: argparse.Namespace, audio: bytes) -> None:
        from faster_whisper import WhisperModel, decode_audio

        from pipelines.asr.model import spec_from_config

        spec = spec_from_config(load_settings(args.config).pipelines["asr"])
        self.cores = len(os.sched_getaffinity(0))
        self.model = WhisperModel(
            spec.source, device=spec.device, compute_type=spec.compute_type,
            cpu_threads=self.cores, num_workers=1,
        )  # fmt: skip
        self.samples = decode_audio(io.BytesIO(audio))
        self.turn = threading.Lock()
        self.transcribe()  # warm up

    def transcribe(self) -> str:
        segments, _ = self.model.transcribe(self.samples, language="en", beam_size=5)
        return "".join(s.text for s in segments).strip()

    def one_at_a_time(self) -> str:
        with self.turn:
            return self.transcribe()


class Service:
    """A private mmq deployment with the shipped config: Redis, the API, the asr worker."""

    def __init__(self, args: argparse.Namespace, stack: ExitStack, audio: bytes, name: str):
        env = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1"}
        dep = private_deployment(
            args.config.read_text(), env, ["asr"], "mmq-bench-asr-",
            test_pipelines=False, reaper=False, worker_timeout_s=180,
        )  # fmt: skip
        self.url = stack.enter_context(dep).base_url
        self.audio, self.name = audio, name
        self.local = threading.local()
        self.transcribe()  # warm up

    def transcribe(self) -> str:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = httpx.Client(
                base_url=self.url, timeout=900, trust_env=False
            )
        r = client.post(
            "/v1/audio/transcriptions",
            files={"file": (self.name, self.audio, "application/octet-stream")},
            data={"model": "whisper-1", "language": "en", "response_format": "json"},
        )
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        return str(r.json()["text"]).strip()


# --- driver --------------------------------------------------------------------------


@dataclass
class Samples:
    latencies: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def closed_loop(call: Transcribe, requests: int, concurrency: int, into: Samples) -> None:
    """`requests` calls over `concurrency` closed-loop lanes (`tuning.load`), each
    lane's calls in a thread of its own."""

    async def one(_: int) -> None:
        sent = time.perf_counter()
        try:
            text = await asyncio.get_running_loop().run_in_executor(pool, call)
        except Exception as exc:
            into.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        into.latencies.append(time.perf_counter() - sent)
        into.texts.append(text)

    with ThreadPoolExecutor(concurrency) as pool:
        into.wall_s += asyncio.run(load.closed_loop(one, requests, concurrency))[1]


def summarize(
    target: str, concurrency: int, got: Samples, duration_s: float, script: str | None
) -> Level:
    from harness.audio import wer

    wers = [wer(script, text) for text in got.texts] if script else []
    return Level(
        target=target,
        concurrency=concurrency,
        requests=len(got.latencies) + len(got.errors),
        completed=len(got.latencies),
        wall_s=got.wall_s,
        audio_s_per_s=len(got.latencies) * duration_s / got.wall_s if got.wall_s else 0.0,
        p50_ms=percentile_ms(got.latencies, 50),
        p99_ms=percentile_ms(got.latencies, 99),
        wer_mean=statistics.fmean(wers) if wers else None,
        wer_max=max(wers) if wers else None,
        errors=got.errors[:5],
    )


def ratios(levels: list[Level]) -> dict[str, float]:
    by = {(lv.target, lv.concurrency): lv for lv in levels}
    out: dict[str, float] = {}
    for (target, c), lv in by.items():
        if target != "mmq":
            continue
        seq, threads = by.get(("sequential", c)), by.get(("threads", c))
        if seq:
            out[f"c{c}_p50_vs_sequential"] = lv.p50_ms / seq.p50_ms
        if threads and c > 1:
            out[f"c{c}_throughput_vs_threads"] = lv.audio_s_per_s / threads.audio_s_per_s
            out[f"c{c}_p99_vs_threads"] = lv.p99_ms / threads.p99_ms
    return out


def table(levels: list[Level], duration_s: float) -> Table:
    t = Table(title=f"ASR, {duration_s:.1f} s clip: audio-seconds per second, end to end")
    for col in ("target", "conc", "done", "audio-s/s", "p50", "p99", "WER mean / max"):
        t.add_column(col, justify="right")
    for lv in levels:
        wer = "-" if lv.wer_mean is None else f"{lv.wer_mean:.3f} / {lv.wer_max:.3f}"
        t.add_row(
            lv.target, str(lv.concurrency), f"{lv.completed}/{lv.requests}",
            f"{lv.audio_s_per_s:.1f}", f"{lv.p50_ms / 1000:.2f} s", f"{lv.p99_ms / 1000:.2f} s",
            wer,
        )  # fmt: skip
    return t


def duration_of(audio: bytes) -> float:
    from faster_whisper import decode_audio

    return len(decode_audio(io.BytesIO(audio))) / 16000


def run(args: argparse.Namespace) -> dict[str, Any]:
    audio, name, script = load_audio(args)
    duration_s = duration_of(audio)
    samples: dict[tuple[str, int], Samples] = {}
    with ExitStack() as stack:
        service = Service(args, stack, audio, name)
        local = InProcess(args, audio)
        calls: dict[str, Transcribe] = {
            "sequential": local.one_at_a_time,
            "threads": local.transcribe,
            "mmq": service.transcribe,
        }
        for round_no in range(args.rounds):
            for c in args.concurrency:
                for target in TARGETS:  # targets take turns: a slow spell hits them alike
                    got = samples.setdefault((target, c), Samples())
                    closed_loop(calls[target], args.requests or max(16, 2 * c), c, got)
                    lv = summarize(target, c, got, duration_s, script)
                    console.print(
                        f"round {round_no + 1}: {target} x{c}: {lv.audio_s_per_s:.1f} audio-s/s,"
                        f" p50 {lv.p50_ms / 1000:.2f} s, p99 {lv.p99_ms / 1000:.2f} s"
                    )
    levels = [summarize(t, c, got, duration_s, script) for (t, c), got in samples.items()]
    levels.sort(key=lambda lv: (lv.concurrency, TARGETS.index(lv.target)))
    return {
        "meta": run_meta(config=str(args.config), cores=len(os.sched_getaffinity(0))),
        "audio": {"name": name, "duration_s": duration_s},
        "goals": GOALS,
        "ratios": ratios(levels),
        "levels": [asdict(lv) for lv in levels],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(table([Level(**lv) for lv in result["levels"]], result["audio"]["duration_s"]))
    for key, value in result["ratios"].items():
        console.print(f"{key}: {value:.2f}")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
