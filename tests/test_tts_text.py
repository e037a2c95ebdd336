"""Sentence splitting and audio encoding of the TTS pipeline, in process (PyAV, no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.tts import decode
from pipelines.tts.encode import Shaper, StreamEncoder, codec_rate, decode_file, encode_file
from pipelines.tts.text import split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Dr. Smith paid $3.50 for No. 5 on Jan. 3. It was 1,000.5 km away! Was it? Yes.",
            [
                "Dr. Smith paid $3.50 for No. 5 on Jan. 3.",
                "It was 1,000.5 km away!",
                "Was it?",
                "Yes.",
            ],
        ),
        ("I said no. Then he left.", ["I said no.", "Then he left."]),
        (
            "J. R. R. Tolkien lived in the U.K. in 1937. Great, e.g. for kids... and adults.",
            ["J. R. R. Tolkien lived in the U.K. in 1937.", "Great, e.g. for kids... and adults."],
        ),
        (
            "1. Preheat the oven. 2. Mix the flour. I came 2. Then left.",
            ["1. Preheat the oven.", "2. Mix the flour.", "I came 2.", "Then left."],
        ),
        (
            "He said \u201cStop!\u201d Then he ran. (Really.) Next one\u2026 Done.",
            ["He said \u201cStop!\u201d", "Then he ran.", "(Really.)", "Next one\u2026", "Done."],
        ),
        (
            "Smith et al. (2020) showed it. Smith et al. The end.",
            ["Smith et al. (2020) showed it.", "Smith et al.", "The end."],
        ),
        (
            "A line\nthat wraps.\n\nA paragraph without a stop\n\n?!",
            ["A line that wraps.", "A paragraph without a stop"],
        ),
    ],
)
def test_sentences_end_where_speech_does(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_long_sentences_are_cut_at_a_pause_and_never_inside_a_number() -> None:
    text = "We counted 1,000, 2,000 and 3,000 sheep; then " + "more and more sheep " * 30 + "came."
    pieces = split_sentences(text, max_chars=80)
    assert all(len(p) <= 80 for p in pieces) and len(pieces) > 5
    assert " ".join(pieces) == " ".join(text.split())
    assert pieces[0].endswith("sheep;")  # the clause mark, not the commas inside 1,000
    assert split_sentences("x" * 250, max_chars=100) == ["x" * 100, "x" * 100, "x" * 50]


def _tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)


@pytest.mark.parametrize(("tempo", "out_rate"), [(1.0, 24000), (2.0, 22050), (0.5, 16000)])
def test_shaper_streams_tempo_and_rate(tempo: float, out_rate: int) -> None:
    samples = _tone(2.0, 22050)
    shaper = Shaper(22050, out_rate, tempo)
    pieces = [shaper.feed(samples[i : i + 5000]) for i in range(0, samples.size, 5000)]
    total = sum(p.size for p in pieces) + shaper.flush().size
    assert total / out_rate == pytest.approx(2.0 / tempo, rel=0.02)


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus"])
def test_stream_encoders_make_playable_files_chunk_by_chunk(fmt: str) -> None:
    samples = _tone(2.0, 22050)
    encoder = StreamEncoder(fmt, 22050)  # type: ignore[arg-type]
    parts = [encoder.feed(samples[i : i + 11025]) for i in range(0, samples.size, 11025)]
    parts.append(encoder.close())
    assert sum(1 for p in parts[:-1] if p) >= 2  # bytes come out before the end
    decoded, rate = decode(b"".join(parts), {"opus": "ogg"}.get(fmt, fmt))
    # Opus decoders always give 48 kHz; mp3 and flac keep 22.05 kHz.
    assert rate == (48000 if fmt == "opus" else codec_rate(fmt, 22050))  # type: ignore[arg-type]
    assert decoded.size / rate == pytest.approx(2.0, abs=0.08)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_files_decode_back(fmt: str, tmp_path: Path) -> None:
    samples = _tone(1.0, 16000)
    path = tmp_path / f"a.{fmt}"
    path.write_bytes(encode_file(samples, 16000, fmt))  # type: ignore[arg-type]
    back = decode_file(str(path), 16000, max_seconds=10)
    assert back.size / 16000 == pytest.approx(1.0, abs=0.08)
    if fmt in {"wav", "flac"}:  # lossless
        assert np.array_equal(np.round(back * 32768).astype(np.int16), samples)
    assert encode_file(samples, 16000, "pcm") == samples.astype("<i2").tobytes()
