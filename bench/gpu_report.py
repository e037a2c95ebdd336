"""The report of `bench.gpu`: a markdown page, the JSON of everything, and a PNG of the
device's utilisation over the run (drawn with Pillow: no plotting library needed)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu_common import SectionResult
from bench.gpu_nvml import Sampler

LABELS = {
    "audio_s_per_s": "audio-s/s",
    "images_per_s": "images/s",
    "jobs_per_s": "jobs/s",
    "tokens_per_s": "tokens/s",
    "concurrency": "conc.",
    "busy_pct": "busy %",
    "mem_mib": "mem MiB",
    "load_warm_s": "load+warm s",
    "gpu_mib": "GPU MiB",
    "built_s": "built s",
    "first_step_p50_s": "first step p50 s",
}
MODELS_NOTE = (
    "Models are built from configs with random weights (harness/models; on the CPU, "
    "ASR uses the packaged tiny.en): compute and memory are the real models', quality "
    "(WER, images, voices, text) is not measured. Ratios compare rows of this one run."
)


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def label(column: str) -> str:
    if column in LABELS:
        return LABELS[column]
    return column.replace("_p50_s", " p50 s").replace("_p99_s", " p99 s").replace("_", " ")


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(label(c) for c in columns) + " |"]
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def section_markdown(result: SectionResult) -> str:
    text = f"## {result.name.upper() if len(result.name) <= 3 else result.name.title()}\n\n"
    if result.skipped:
        return text + f"Not measured: {result.skipped}\n\n"
    for table in result.tables:
        text += f"**{table.title}**\n\n" + markdown_table(table.columns, table.rows) + "\n"
        text += "".join(f"- error: {e}\n" for r in table.rows for e in r.get("errors") or [])
    if result.ratios:
        text += "Ratios:\n\n" + "".join(f"- {k}: {fmt(v)}x\n" for k, v in result.ratios.items())
    text += "".join(f"\n{note}\n" for note in result.notes)
    return text + "\n"


def report_markdown(meta: dict[str, Any], results: list[SectionResult], sampler: Sampler) -> str:
    text = f"# mmq on {meta['device_name']} (`{meta['command']}`)\n\n"
    text += f"{meta['finished_at']}, {meta['mode']}. {MODELS_NOTE}\n\n"
    text += "".join(section_markdown(r) for r in results)
    loads = [row for r in results for row in r.loads]
    text += "## Models: built, loaded and warmed\n\n"
    text += markdown_table(["model", "built_s", "cached"], meta["builds"]) + "\n"
    text += markdown_table(["model", "where", "instances", "load_warm_s", "gpu_mib"], loads)
    text += (
        "\nload+warm: from the worker's start (process, imports, load, warm-up) to its "
        "registration; in process: load and one warm-up call.\n\n"
    )
    text += checks_markdown(meta.get("checks", []))
    text += f"## {sampler.probe.kind.upper()} utilisation\n\n![utilisation](gpu-util.png)\n\n"
    text += markdown_table(["phase", "seconds", "busy_pct", "mem_mib"], phase_rows(sampler))
    text += f"\n{meta['busy_note']}\n"
    return text


def checks_markdown(checks: list[dict[str, Any]]) -> str:
    """Each worker's device and pinning, the devices the workers report, and the GPU
    series of `/metrics`, as read once each group had loaded."""
    if not checks:
        return ""
    text = "## Deployment: devices, pinning, metrics\n\n"
    workers = [w | {"group": c["group"]} for c in checks for w in c.get("workers", [])]
    text += markdown_table(["group", "name", "device", "cuda_visible_devices", "up"], workers)
    devices = {d.get("uuid") or d.get("device"): d for c in checks for d in c.get("devices", [])}
    if devices:
        text += "\n" + markdown_table(
            ["device", "uuid", "name", "utilization", "memory_used_bytes", "memory_total_bytes"],
            list(devices.values()),
        )
    metrics = list(dict.fromkeys(m for c in checks for m in c.get("gpu_metrics", [])))
    if metrics:
        text += "\n`/metrics`, the GPU series:\n\n```\n" + "\n".join(metrics[:12]) + "\n```\n"
    text += "".join(f"\n{c['group']}: check failed: {c['error']}\n" for c in checks if "error" in c)
    return text + "\n"


def phase_rows(sampler: Sampler) -> list[dict[str, Any]]:
    rows = []
    for name in dict.fromkeys(s.name for s in sampler.spans):
        seconds = sum(s.end_s - s.start_s for s in sampler.spans if s.name == name)
        usage = sampler.usage(name)
        rows.append(
            {
                "phase": name,
                "seconds": seconds,
                "busy_pct": usage.busy_mean_pct if usage else None,
                "mem_mib": usage.mem_max_mib if usage else None,
            }
        )
    return rows


def write(
    out_dir: Path, meta: dict[str, Any], results: list[SectionResult], sampler: Sampler
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {"md": "gpu.md", "json": "gpu.json", "png": "gpu-util.png"}
    paths = {kind: out_dir / name for kind, name in names.items()}
    paths["md"].write_text(report_markdown(meta, results, sampler))
    payload = {
        "meta": meta,
        "sections": [asdict(r) for r in results],
        "phases": phase_rows(sampler),
        "spans": [asdict(s) for s in sampler.spans],
        "readings": [asdict(r) for r in sampler.readings],
    }
    paths["json"].write_text(json.dumps(payload, indent=1, default=str) + "\n")
    draw(sampler, paths["png"], f"{sampler.probe.kind.upper()}: {sampler.probe.name}")
    return paths


def draw(sampler: Sampler, path: Path, title: str, size: tuple[int, int] = (1400, 520)) -> None:
    """Busy % (blue) and memory (orange, scaled to its maximum) over time, with the
    measured spans shaded and named."""
    from PIL import Image, ImageDraw

    width, height = size
    left, right, top, bottom = 60, 20, 130, 40
    image = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(image)
    readings = sampler.readings
    end_s = max([r.t_s for r in readings] + [s.end_s for s in sampler.spans] + [1.0])
    mem_max = max([r.mem_mib for r in readings] + [1.0])

    def x(t: float) -> float:
        return left + (width - left - right) * t / end_s

    def y(fraction: float) -> float:
        return height - bottom - (height - top - bottom) * fraction

    shades = [(235, 242, 252), (252, 240, 228)]
    for i, span in enumerate(s for s in sampler.spans if s.name != "loading"):
        pen.rectangle([x(span.start_s), y(1), x(span.end_s), y(0)], fill=shades[i % 2])
        pen.text((x(span.start_s) + 2, 30 + 16 * (i % 6)), span.name[:28], fill=(60, 60, 60))
    for pct in range(0, 101, 20):
        pen.line([left, y(pct / 100), width - right, y(pct / 100)], fill=(220, 220, 220))
        pen.text((8, y(pct / 100) - 6), f"{pct}%", fill=(0, 0, 0))
    step = _tick_step(end_s)
    for i in range(int(end_s // step) + 1):
        pen.text((x(i * step) - 8, height - bottom + 8), f"{i * step:g}s", fill=(0, 0, 0))
    lines = (("mem_mib", (230, 120, 20), mem_max), ("busy_pct", (30, 90, 200), 100.0))
    for key, colour, scale in lines:
        points = [(x(r.t_s), y(getattr(r, key) / scale)) for r in readings]
        if len(points) > 1:
            pen.line(points, fill=colour, width=2)
    legend = f"{title}: busy % (blue), memory (orange, max {mem_max:.0f} MiB)"
    pen.text((left, 8), legend, fill=(0, 0, 0))
    if not readings:
        pen.text((left, height // 2), "no readings", fill=(200, 0, 0))
    image.save(path)


def _tick_step(end_s: float) -> float:
    for step in (5, 10, 15, 30, 60, 120, 300, 600):
        if end_s / step <= 12:
            return step
    return 1200
