"""`python -m bench.gpu`: the CPU smoke run CI keeps alive, and the random-weight models
it builds for GPUs, checked at small sizes.

The smoke run is the command as a user types it (a subprocess with real parts: Redis,
the API, Celery workers, `transformers serve`), with the tiny models; the GPU run differs
only in models, counts and device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.gpu_nvml import nvml_reason

REPO = Path(__file__).resolve().parents[1]
SMOKE_TIMEOUT_S = 240
"""A hang fails the test; the run itself takes about a minute on two cores."""
RATES = {"asr": "audio_s_per_s", "image": "images_per_s", "tts": "audio_s_per_s"}


def bench(*args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("OUT", None)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return done, time.monotonic() - start


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_quick_cpu_run_measures_every_section(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from harness.models.llm import cached_tiny_llm
    from harness.models.sd import cached_tiny_sd

    out, models = tmp_path / "out", tmp_path / "m"
    models.mkdir()
    # The session's tiny SD and LLM (the same builders at the same size) are models that
    # bench.gpu finds built in its --models-dir; it builds the rest (VITS).
    for name, built in (("sd-tiny", cached_tiny_sd), ("llm-tiny", cached_tiny_llm)):
        path = built(tmp_path_factory)
        (path / ".bench-built.json").write_text('{"built_s": null}')
        (models / name).symlink_to(path, target_is_directory=True)
    done, took_s = bench(
        "--device", "cpu", "--quick", "--out-dir", str(out), "--models-dir", str(models),
        timeout_s=SMOKE_TIMEOUT_S,
    )  # fmt: skip
    print(f"bench.gpu --device cpu --quick took {took_s:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    sections = {s["name"]: s for s in report["sections"]}
    assert list(sections) == ["asr", "image", "tts", "llm"]
    for name, section in sections.items():
        assert not section["skipped"], (name, section["skipped"])
        rows = [row for table in section["tables"] for row in table["rows"]]
        assert rows and all(row["failed"] == 0 for row in rows), (name, rows)
        assert all(value > 0 for value in section["ratios"].values()), (name, section["ratios"])
        if name in RATES:
            assert all(row[RATES[name]] > 0 for row in rows), (name, rows)
    llm = [row for t in sections["llm"]["tables"] for row in t["rows"]]
    assert {(r["target"], r["concurrency"]) for r in llm} == {
        ("direct", 1),
        ("service", 1),
        ("direct", 4),
        ("service", 4),
    }
    # Random weights never end early: every request decodes max_tokens (16); at least 4
    # requests a level, two per lane.
    assert all(r["tokens"] == max(4, 2 * r["concurrency"]) * 16 for r in llm), llm
    # GPU-only measures are absent on the CPU, never made up.
    assert any("vLLM" in note for note in sections["llm"]["notes"])
    loads = [row for s in sections.values() for row in s["loads"]]
    assert loads and all(r["gpu_mib"] is None and r["load_warm_s"] > 0 for r in loads)
    assert report["readings"] and report["phases"]
    builds = {b["model"]: b["cached"] for b in report["meta"]["builds"]}
    assert builds == {"SD tiny": True, "llm-tiny": True, "VITS tiny": False}, builds
    markdown = (out / "gpu.md").read_text()
    assert "random weights" in markdown and "need --device cuda" in markdown
    from PIL import Image

    with Image.open(out / "gpu-util.png") as image:
        assert image.size == (1400, 520)


@pytest.mark.skipif(nvml_reason() is None, reason="this host has a GPU")
def test_cuda_without_a_gpu_stops_at_once(tmp_path: Path) -> None:
    """Before it builds, starts or writes anything (the subprocess's timeout is the guard
    against a run that goes on instead)."""
    out, models = tmp_path / "out", tmp_path / "models"
    done, _ = bench(
        "--device", "cuda", "--out-dir", str(out), "--models-dir", str(models), timeout_s=120
    )  # fmt: skip
    assert done.returncode == 2
    assert "--device cuda, but" in done.stderr and "--device cpu --quick" in done.stderr
    assert not out.exists() and not models.exists()


def test_whisper_builder_decodes_a_designed_window(tmp_path: Path) -> None:
    """The random Whisper ends every window after its fixed text, confidently, whatever
    the audio: no fallback, one segment a window, the next window a full window later."""
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from harness.models.whisper import TEXT_TOKENS, build_whisper

    model = WhisperModel(str(build_whisper(tmp_path / "w", "tiny")), compute_type="int8")
    audio = np.random.default_rng(0).normal(0, 0.1, 36 * 16000).astype(np.float32)
    segments = list(model.transcribe(audio, language="en", beam_size=1)[0])
    assert [s.start for s in segments] == [0.0, 30.0]
    for segment in segments:
        assert segment.temperature == 0.0 and segment.avg_logprob > -0.2
        assert len(segment.tokens) == TEXT_TOKENS + 2  # <|0.00|> text <|29.98|>
        assert segment.text.isalpha()
    chunks = [{"start": 0.0, "end": 30.0}, {"start": 30.0, "end": 36.0}]
    pipe = BatchedInferencePipeline(model)
    batched = list(pipe.transcribe(audio, language="en", beam_size=1, clip_timestamps=chunks)[0])
    assert len(batched) == 2 and all(len(s.tokens) >= TEXT_TOKENS for s in batched)


def test_llama3_vocabulary_model_streams_ascii_to_max_tokens(tmp_path: Path) -> None:
    """The 8B builder's tokenizer and output layer, at a tiny width: greedy decoding
    never ends early and every token decodes to ASCII."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.models.llm import build_llm

    path = build_llm(tmp_path / "llm", "tiny-llama3-vocab")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert len(tokenizer) == model.config.vocab_size == 128256
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}], add_generation_prompt=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)
    new = out[0, len(ids) :].tolist()
    assert len(new) == 48 and tokenizer.eos_token_id not in new
    text = tokenizer.decode(new)
    assert text.isascii() and len(text) >= 48
