"""Models loaded on demand, measured on real models: cold vs warm first-result latency
per kind, and loads per minute under a mixed load with and without the anti-thrash rule.

    python -m bench.residency [--kinds asr,tts,image,llm] [--warm 3]
                              [--mixed-s 60] [--rate 2] [--min-loaded-s 10]
                              [--out bench/results/residency.json]

1. **Cold vs warm.** One deployment with every kind on demand (the tiny.en and Piper
   models that pip ships, the tiny SD and LLM that the tests build) and no device budget.
   Per kind: a first job (its model loads) and `--warm` more, one at a time. Reported:
   the first output's latency from submit (ASR's first segment, TTS's first audio, an
   image's first step, an LLM's first token) and `load_ms`, cold and warm.
2. **Mixed load.** TTS and ASR on demand on a CPU "device" whose budget fits one of them.
   Jobs alternate between the two kinds, `--rate` a second for `--mixed-s`, once with
   `min_loaded_s = 0` (a model yields as soon as its queue is empty) and once with
   `--min-loaded-s` (the anti-thrash rule), a worker process each; then with
   `min_loaded_s = 0` and both in one process (`share_process`). Reported: loads per
   minute, jobs that succeeded, and end-to-end p50/p99 per kind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import redis
from rich.console import Console
from rich.table import Table

from bench.common import percentile_ms, run_meta
from harness.audio import SHORT, spoken
from harness.kinds import pipeline_toml
from harness.scrape import scrape, value
from jobstore.api_keys import create_key
from tuning.deployment import Deployment, private_deployment

console = Console(width=140)

MEMORY_GB = {"tts": 1.0, "asr": 1.0, "image": 1.0, "llm": 3.0}
"""What each model is counted at on the device (an LLM engine is sized in it)."""


def _residency(kind: str, min_loaded_s: float, shared: bool) -> str:
    return (
        f'memory_gb = {MEMORY_GB[kind]}\nresidency = "on_demand"\nidle_unload_s = 3600\n'
        f"min_loaded_s = {min_loaded_s}\nshare_process = {str(shared).lower()}\n"
    )


@contextlib.contextmanager
def deployment(
    kinds: list[str],
    env: dict[str, str],
    min_loaded_s: float,
    models: dict[str, Path],
    shared: bool = False,
) -> Iterator[tuple[Deployment, httpx.Client]]:
    """A private deployment of `kinds` on demand (a worker process each, or one for all
    with `shared`), and a client with a key."""
    config = "".join(pipeline_toml(k, models, _residency(k, min_loaded_s, shared)) for k in kinds)
    env = {"HF_HUB_OFFLINE": "1", **env}
    workers = [] if shared else kinds
    with private_deployment(config, env, workers, prefix="mmq-residency-") as dep:
        if shared:
            dep.start_worker(kinds, timeout_s=120)
        key = create_key(redis.Redis.from_url(dep.redis_url, decode_responses=True), "bench")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(
            base_url=dep.base_url, headers=headers, timeout=300, trust_env=False
        ) as http:
            yield dep, http


def _input(kind: str, audio_key: str, i: int) -> dict[str, Any]:
    if kind == "tts":
        return {"text": f"This is reading number {i}.", "format": "wav"}
    if kind == "asr":
        return {"audio": audio_key}
    if kind == "image":
        return {"prompt": f"a red square {i}", "width": 64, "height": 64, "steps": 4}
    return {"prompt": f"Count to {i}:", "max_tokens": 16}


def _wait(http: httpx.Client, job_id: str) -> dict[str, Any]:
    while True:
        r = http.get(f"/v1/jobs/{job_id}", headers={"Prefer": "wait=30"})
        if r.status_code == 200:
            return dict(r.json())


def _upload(http: httpx.Client) -> str:
    r = http.post("/v1/files", files={"file": ("s.wav", spoken(SHORT[:1]), "audio/wav")})
    r.raise_for_status()
    return str(r.json()["key"])


def cold_vs_warm(args: argparse.Namespace, models: dict[str, Path]) -> list[dict[str, Any]]:
    rows = []
    with deployment(args.kinds, {}, 0, models) as (_dep, http):
        audio = _upload(http)
        for kind in args.kinds:
            runs = []
            for i in range(1 + args.warm):
                body = {"kind": kind, "input": _input(kind, audio, i)}
                job = _wait(http, http.post("/v1/jobs", json=body).json()["id"])
                if job["status"] != "succeeded":
                    raise SystemExit(f"{kind} job {job['id']} ended {job['status']}: {job}")
                runs.append(job["timings"])
            cold, warm = runs[0], runs[1:]
            warm_first = statistics.median(t["time_to_first_output_ms"] for t in warm)
            rows.append(
                {
                    "kind": kind,
                    "cold_first_output_ms": cold["time_to_first_output_ms"],
                    "cold_load_ms": cold["load_ms"],
                    "warm_first_output_ms": warm_first,
                    "cold_over_warm": cold["time_to_first_output_ms"] / warm_first,
                }
            )
            console.print(rows[-1])
    return rows


def mixed(args: argparse.Namespace, min_loaded_s: float, shared: bool = False) -> dict[str, Any]:
    env = {"MMQ_DEVICE_MEMORY_GB": json.dumps({"cpu": 1.5})}
    with deployment(["tts", "asr"], env, min_loaded_s, {}, shared) as (dep, http):
        audio = _upload(http)
        ids: list[tuple[str, str]] = []
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < args.mixed_s:
            kind = ("tts", "asr")[i % 2]
            body = {"kind": kind, "input": _input(kind, audio, i)}
            ids.append((kind, http.post("/v1/jobs", json=body).json()["id"]))
            i += 1
            time.sleep(max(0.0, started + i / args.rate - time.monotonic()))
        jobs = [(kind, _wait(http, job_id)) for kind, job_id in ids]
        span_s = time.monotonic() - started
        time.sleep(1.5)  # the workers' last metrics write
        samples = scrape(dep)
    loads = sum(value(samples, "mmq_model_loads_total", pipeline=p) for p in ("tts", "asr"))
    row: dict[str, Any] = {
        "processes": "one for both" if shared else "one each",
        "min_loaded_s": min_loaded_s,
        "jobs": len(jobs),
        "succeeded": sum(j["status"] == "succeeded" for _, j in jobs),
        "loads": loads,
        "loads_per_min": loads / (span_s / 60),
        "seconds": span_s,
    }
    for kind in ("tts", "asr"):
        e2e = [j["timings"]["total_ms"] / 1000 for k, j in jobs if k == kind and j["timings"]]
        row[f"{kind}_p50_ms"] = percentile_ms(e2e, 50)
        row[f"{kind}_p99_ms"] = percentile_ms(e2e, 99)
    console.print(row)
    return row


def _models(kinds: list[str], tmp: Path) -> dict[str, Path]:
    models: dict[str, Path] = {}
    if "image" in kinds:
        from harness.models.sd import build_tiny_sd

        models["sd"] = build_tiny_sd(tmp / "sd")
    if "llm" in kinds:
        from harness.models.llm import build_tiny_llm

        models["llm"] = build_tiny_llm(tmp / "llm")
    return models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.residency", description=__doc__)
    parser.add_argument("--kinds", default="asr,tts,image,llm", type=lambda s: s.split(","))
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--mixed-s", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--min-loaded-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/residency.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mmq-residency-models-") as tmp:
        first = cold_vs_warm(args, _models(args.kinds, Path(tmp)))
    turns = [mixed(args, 0.0), mixed(args, args.min_loaded_s), mixed(args, 0.0, shared=True)]
    table = Table(title="Cold vs warm first output, one job at a time (one run)")
    for column in first[0]:
        table.add_column(column, justify="right")
    for row in first:
        table.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)
    table = Table(title=f"TTS and ASR alternating, {args.rate}/s for {args.mixed_s:.0f} s, "
                  "a device that fits one")  # fmt: skip
    for column in turns[0]:
        table.add_column(column, justify="right")
    for row in turns:
        table.add_row(*[f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()])
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"cold_vs_warm": first, "mixed": turns, "meta": run_meta()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
