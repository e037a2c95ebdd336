"""TTS deployments for tests: the Piper voice the package ships and a tiny Coqui VITS,
behind the real pipeline, in real worker processes; and what the tests check audio with."""

from __future__ import annotations

import base64
import io
import json
import re
import wave
from pathlib import Path
from typing import cast

import av
import httpx
import jiwer
import numpy as np

from harness.models.coqui import build_tiny_vits, build_tiny_xtts
from jobs.outputs import TtsChunk
from jobs.wire import Event
from tuning.deployment import START_TIMEOUT_S, Deployment, Proc

TTS_PIPELINE = """
[pipelines.tts]
kind = "tts"
impl = "pipelines.tts:TtsPipeline"
aliases = ["tts-1"]
max_batch = 1
concurrency = 1
instances = {instances}

[pipelines.tts.options]
default_voice = "joe"
max_sentence_chars = 200
threads = {threads}

[pipelines.tts.options.voices.joe]
engine = "piper"
aliases = ["alloy"]

[pipelines.tts.options.voices.tiny]
engine = "coqui"
model = "{model}"
config = "{config}"

"""
XTTS_VOICE = """
[pipelines.tts.options.voices.clone]
engine = "coqui"
model = "{xtts}"
config = "{xtts_config}"
language = "en"
"""

ENV = {"HF_HUB_OFFLINE": "1", "MMQ_API__KEEPALIVE_S": "1", "MMQ_LIMITS__TEXT_MAX_CHARS": "3000"}


def tts_deployment(
    redis_url: str, tmp: Path, instances: int = 1, threads: int = 0, xtts: bool = True
) -> Deployment:
    """A deployment with the `tts` pipeline: Piper `joe`, Coqui VITS `tiny` and, with
    `xtts`, Coqui XTTS `clone`."""
    model, config = build_tiny_vits(tmp / "vits")
    dep = Deployment(redis_url, tmp, env_overrides=dict(ENV))
    values = {"model": model.as_posix(), "config": config.as_posix()}
    pipeline = TTS_PIPELINE.format(instances=instances, threads=threads, **values)
    if xtts:
        directory, xtts_config = build_tiny_xtts(tmp / "xtts")
        pipeline += XTTS_VOICE.format(xtts=directory.as_posix(), xtts_config=xtts_config.as_posix())
    dep.config_path.write_text(dep.config_path.read_text() + pipeline)
    return dep


def start_workers(
    dep: Deployment, pipeline: str, count: int, timeout_s: float = 2 * START_TIMEOUT_S
) -> list[Proc]:
    """`count` instances of `pipeline`, started together, once all are ready (a bound for
    a busy host: Piper, a Coqui VITS and an XTTS load in each, and took over 90 s on two
    cores shared with another test process)."""
    procs = [
        dep.spawn(f"worker-{pipeline}-{i}", "worker", "--pipeline", pipeline, "--instance", str(i))
        for i in range(count)
    ]
    dep.wait_started(procs, timeout_s=timeout_s)
    return procs


def events(http: httpx.Client, job_id: str) -> list[Event]:
    """Every event of an ended job, from its SSE stream."""
    found: list[Event] = []
    with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                found.append(json.loads(line[6:]))
    return found


def partial_pcm(found: list[Event]) -> np.ndarray:
    partials = [cast(TtsChunk, e["data"]) for e in found if e["type"] == "partial"]
    chunks = [base64.b64decode(chunk["audio"]) for chunk in partials]
    return np.frombuffer(b"".join(chunks), dtype="<i2")


def decode(data: bytes, fmt: str | None = None) -> tuple[np.ndarray, int]:
    """Mono float32 samples and the rate of an encoded file (`fmt`: container name)."""
    with av.open(io.BytesIO(data), mode="r", format=fmt) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].sample_rate
    samples = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    scale = 32768.0 if samples.dtype == np.int16 else 1.0
    return np.asarray(samples, dtype=np.float32) / scale, int(rate)


SPOKEN_FORMS = {"dr": "doctor", "mr": "mister", "mrs": "missus", "st": "saint"}
"""Abbreviations as they are said: "Dr." is read "doctor", and written back either way."""
ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def said(word: str) -> str:
    """A word as it is spoken: a number under 100 in words, an abbreviation whole."""
    if word.isdigit() and int(word) < 100:
        n = int(word)
        if n < 20:
            return ONES[n]
        return TENS[n // 10 - 2] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    return SPOKEN_FORMS.get(word, word)


def normalize(text: str) -> str:
    """Lower case, no punctuation, numbers and abbreviations as said (as Whisper's own
    evaluation normalizes): "9" and "nine" are the same word heard."""
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    return " ".join(said(word) for word in words)


def word_error_rate(reference: str, hypothesis: str) -> float:
    return float(jiwer.wer(normalize(reference), normalize(hypothesis)))


def tone_wav(seconds: float = 3.0, rate: int = 22050, seed: int = 0) -> bytes:
    """A WAV of a voiced-like tone with noise: a reference clip for the cloning voice."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(seed).normal(0, 0.05, t.size)
    wave_ = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2 + noise
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(wave_, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()
