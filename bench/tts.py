"""TTS: time to first audio beside total synthesis, and throughput with 1 vs 2 instances.

    python -m bench.tts [--jobs 16] [--concurrency 4] [--ttfa-runs 5]
                        [--coqui-model PATH --coqui-config PATH --coqui-speaker NAME]
                        [--device cpu]
                        [--out bench/results/tts.json]

In one run, on a private Redis, it starts the API and the `tts` workers three times:

- `1x2`: one instance with every core (`threads = 0`), the default;
- `1x1`: one instance on one thread;
- `2x1`: two instances (two worker processes) of one thread each.

On the first it streams a 5-sentence text from `POST /v1/audio/speech` (pcm) `--ttfa-runs`
times, one at a time: time to the first byte against time to the last; then, in this
process while the workers idle, Piper itself (`PiperVoice.synthesize`) on the same text:
mmq's first audio and total over the library's, as ratios. On each it sends
`--jobs` jobs over `--concurrency` lanes (`POST /v1/jobs`, `Prefer: wait`) and counts
jobs and seconds of audio per second. Goals: first audio <= 25 % of the total; `2x1`
>= 1.5x the throughput of `1x2`. With `--coqui-model` (e.g. on a CUDA host with
`--device gpu:0`) a Coqui voice is measured beside Piper.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.common import LevelSummary, measure
from tuning.deployment import private_deployment

TEXT = (
    "The meeting starts at nine in the morning. Please bring the report from last week. "
    "We will talk about the budget and the new office. Lunch is served at noon in the hall. "
    "Everyone should be home before six in the evening."
)
CONFIGS = {"1x2": (1, 0), "1x1": (1, 1), "2x1": (2, 1)}
"""Name: (instances, threads per instance)."""
FIRST_AUDIO_GOAL = 0.25
INSTANCES_GOAL = 1.5
ENV = {"MMQ_AUTH__REQUIRED": "false", "MMQ_API__HOST": "127.0.0.1"}
console = Console()


@dataclass
class FirstAudio:
    voice: str
    runs: int
    first_byte_ms: float
    """Client side, p50: request sent to the first audio byte."""
    last_byte_ms: float
    """Client side, p50: request sent to the last audio byte."""
    worker_first_ms: float
    """Worker side, p50: run start to the first chunk (the job's `timings.first_audio_ms`)."""
    worker_total_ms: float
    """Worker side, p50: run start to the last chunk (`timings.synthesis_ms`)."""
    ratio: float = 0.0
    """first_byte_ms / last_byte_ms."""


@dataclass
class Throughput:
    config: str
    voice: str
    instances: int
    threads: int
    summary: LevelSummary
    audio_s_per_s: float
    worker_rss_mib: list[float] = field(default_factory=list)


def tts_config(instances: int, threads: int, args: argparse.Namespace) -> str:
    text = f"""
[pipelines.tts]
kind = "tts"
impl = "pipelines.tts:TtsPipeline"
max_batch = 1
concurrency = 1
instances = {instances}
device = "{args.device}"
[pipelines.tts.options]
threads = {threads}
[pipelines.tts.options.voices.joe]
engine = "piper"
"""
    if args.coqui_model:
        text += '[pipelines.tts.options.voices.coqui]\nengine = "coqui"\n'
        text += f'model = "{args.coqui_model}"\n'
        for key in ("config", "speaker", "language"):
            if value := getattr(args, f"coqui_{key}"):
                text += f'{key} = "{value}"\n'
    return text


def rss_mib(pids: list[int]) -> list[float]:
    found = []
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        found.append(round(kib / 1024, 1))
    return found


async def first_audio(api_url: str, voice: str, runs: int) -> FirstAudio:
    body = {"model": "tts", "voice": voice, "input": TEXT, "response_format": "pcm"}
    client_first, client_last, worker_first, worker_total = [], [], [], []
    async with httpx.AsyncClient(base_url=api_url, timeout=120) as client:
        for _ in range(runs + 1):  # the first run warms up and is not counted
            start = time.perf_counter()
            first = 0.0
            async with client.stream("POST", "/v1/audio/speech", json=body) as response:
                response.raise_for_status()
                async for _chunk in response.aiter_bytes():
                    first = first or time.perf_counter() - start
                job_id = response.headers["x-job-id"]
            last = time.perf_counter() - start
            job = (await client.get(f"/v1/jobs/{job_id}", headers={"Prefer": "wait=30"})).json()
            client_first.append(first * 1000)
            client_last.append(last * 1000)
            worker_first.append(job["timings"]["first_audio_ms"])
            worker_total.append(job["timings"]["synthesis_ms"])
    p50 = [
        statistics.median(xs[1:]) for xs in (client_first, client_last, worker_first, worker_total)
    ]
    first, last, w_first, w_total = p50
    return FirstAudio(voice, runs, first, last, w_first, w_total, ratio=first / last)


@dataclass
class Direct:
    """Piper called in this process (`PiperVoice.load`, `synthesize`), every core."""

    runs: int
    first_ms: float
    """p50: call to the first sentence's audio."""
    total_ms: float
    """p50: call to the last sentence's audio."""


def direct_first_audio(runs: int) -> Direct:
    from piper import PiperVoice

    from pipelines.tts.piper import default_voice_paths

    model, config = default_voice_paths()
    voice = PiperVoice.load(model, config_path=config)
    firsts, totals = [], []
    for _ in range(runs + 1):  # the first run warms up and is not counted
        start = time.perf_counter()
        first = 0.0
        for _chunk in voice.synthesize(TEXT):
            first = first or time.perf_counter() - start
        firsts.append(first * 1000)
        totals.append((time.perf_counter() - start) * 1000)
    return Direct(runs, statistics.median(firsts[1:]), statistics.median(totals[1:]))


async def throughput(api_url: str, name: str, voice: str, args: argparse.Namespace) -> Throughput:
    audio_s: list[float] = []
    body = {"kind": "tts", "input": {"text": TEXT, "voice": voice, "format": "pcm"}}

    async with httpx.AsyncClient(base_url=api_url, timeout=300) as client:

        async def call() -> str | None:
            r = await client.post("/v1/jobs", json=body, headers={"Prefer": "wait=60"})
            job = r.json()
            if r.status_code != 200 or job.get("status") != "succeeded":
                return f"{r.status_code} {job.get('status')} {job.get('error')}"
            audio_s.append(job["output"]["duration_s"])
            return None

        await measure(f"{name} warm-up", call, 2, 2)
        audio_s.clear()
        summary = await measure(name, call, args.jobs, args.concurrency)
    instances, threads = CONFIGS[name]
    return Throughput(name, voice, instances, threads, summary, sum(audio_s) / summary.duration_s)


def run(args: argparse.Namespace) -> tuple[list[FirstAudio], list[Throughput], Direct]:
    voices = ["joe", *(["coqui"] if args.coqui_model else [])]
    firsts: list[FirstAudio] = []
    rates: list[Throughput] = []
    direct = Direct(0, float("nan"), float("nan"))
    for name, (instances, threads) in CONFIGS.items():
        config = tts_config(instances, threads, args)
        with private_deployment(
            config, ENV, ["tts"] * instances, "mmq-bench-tts-",
            test_pipelines=False, reaper=False, worker_timeout_s=180,
        ) as dep:  # fmt: skip
            console.print(f"[bold]{name}[/bold]: ready at {dep.base_url}")
            for voice in voices:
                if name == "1x2":
                    firsts.append(asyncio.run(first_audio(dep.base_url, voice, args.ttfa_runs)))
                if name == "1x2" and voice == "joe":  # in process, the workers idle
                    direct = direct_first_audio(args.ttfa_runs)
                result = asyncio.run(throughput(dep.base_url, name, voice, args))
                result.worker_rss_mib = rss_mib(dep.pids("worker-tts-"))
                rates.append(result)
    return firsts, rates, direct


def report(
    firsts: list[FirstAudio], rates: list[Throughput], direct: Direct, out: Path
) -> dict[str, Any]:
    table = Table(title="Time to first audio (5 sentences, pcm, p50)")
    for column in (
        "voice",
        "first byte ms",
        "last byte ms",
        "first/last",
        "worker first ms",
        "worker total ms",
    ):
        table.add_column(column, justify="right")
    for f in firsts:
        table.add_row(
            f.voice,
            f"{f.first_byte_ms:.0f}",
            f"{f.last_byte_ms:.0f}",
            f"{f.ratio:.0%}",
            f"{f.worker_first_ms:.0f}",
            f"{f.worker_total_ms:.0f}",
        )
    console.print(table)
    table = Table(title="Throughput (jobs of 5 sentences, closed loop)")
    for column in (
        "config",
        "voice",
        "jobs/s",
        "audio s/s",
        "p50 ms",
        "p95 ms",
        "fails",
        "worker RSS MiB",
    ):
        table.add_column(column, justify="right")
    for t in rates:
        s = t.summary
        table.add_row(
            t.config,
            t.voice,
            f"{s.throughput:.2f}",
            f"{t.audio_s_per_s:.1f}",
            f"{s.p50_ms:.0f}",
            f"{s.p95_ms:.0f}",
            str(s.failures),
            ", ".join(map(str, t.worker_rss_mib)),
        )
    console.print(table)
    ratios = {}
    for voice in {t.voice for t in rates}:
        by = {t.config: t.summary.throughput for t in rates if t.voice == voice}
        ratios[voice] = {"2x1 / 1x2": by["2x1"] / by["1x2"], "2x1 / 1x1": by["2x1"] / by["1x1"]}
        console.print(
            f"{voice}: 2 instances / 1 instance (all cores) = {ratios[voice]['2x1 / 1x2']:.2f}x, "
            f"/ 1 instance (1 thread) = {ratios[voice]['2x1 / 1x1']:.2f}x "
            f"(goal >= {INSTANCES_GOAL}x)"
        )
    for f in firsts:
        console.print(
            f"{f.voice}: first audio at {f.ratio:.0%} of the total (goal <= {FIRST_AUDIO_GOAL:.0%})"
        )
    joe = next((f for f in firsts if f.voice == "joe"), None)
    if joe is not None and direct.runs:
        ratios["service_vs_direct"] = {
            "first_audio": joe.first_byte_ms / direct.first_ms,
            "total": joe.last_byte_ms / direct.total_ms,
            "first_audio_added_ms": joe.first_byte_ms - direct.first_ms,
            "total_added_ms": joe.last_byte_ms - direct.total_ms,
        }
        console.print(
            f"joe through mmq vs Piper in process (p50): first audio {joe.first_byte_ms:.0f} vs "
            f"{direct.first_ms:.0f} ms ({joe.first_byte_ms / direct.first_ms:.2f}x), total "
            f"{joe.last_byte_ms:.0f} vs {direct.total_ms:.0f} ms "
            f"({joe.last_byte_ms / direct.total_ms:.2f}x)"
        )
    payload = {
        "meta": {
            "cpu_count": os.cpu_count(),
            "argv": sys.argv[1:],
            "text": TEXT,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "goals": {"first_audio_ratio_max": FIRST_AUDIO_GOAL, "instances_ratio_min": INSTANCES_GOAL},
        "first_audio": [asdict(f) for f in firsts],
        "direct": asdict(direct),
        "throughput": [asdict(t) for t in rates],
        "ratios": ratios,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    console.print(f"results written to {out}")
    return payload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=16, help="jobs per throughput level")
    parser.add_argument("--concurrency", type=int, default=4, help="lanes of the closed loop")
    parser.add_argument("--ttfa-runs", type=int, default=5, help="streamed requests, one at a time")
    parser.add_argument("--device", default="cpu", help="cpu, gpu:N or mig:UUID")
    parser.add_argument("--coqui-model", help="a Coqui model name or checkpoint to measure too")
    parser.add_argument("--coqui-config", help="its config.json (with a checkpoint path)")
    parser.add_argument("--coqui-speaker", help="XTTS: a built-in speaker (no clip is sent)")
    parser.add_argument("--coqui-language", help="XTTS: the language, e.g. en")
    parser.add_argument("--out", type=Path, default=Path("bench/results/tts.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        firsts, rates, direct = run(args)
    except (RuntimeError, TimeoutError, KeyboardInterrupt) as exc:
        console.print(f"[red]bench failed: {exc!r}; everything started here is stopped[/red]")
        return 1
    report(firsts, rates, direct, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
