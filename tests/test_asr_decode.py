"""Decoding uploads to 16 kHz mono float32 with PyAV, within the settings' limits."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from harness.audio import FORMATS, SHORT, encode, silence, speech, spoken
from jobs.errors import InputError, TooLarge
from jobs.settings import Limits
from pipelines.asr.decode import SAMPLE_RATE, decode_file
from pipelines.asr.prepare import quiet_cut


def _write(tmp_path: Path, data: bytes, name: str) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("suffix", sorted(FORMATS))
def test_every_format_decodes_to_16k_mono(tmp_path: Path, suffix: str) -> None:
    samples, rate = speech(SHORT)
    path = _write(tmp_path, spoken(SHORT, suffix), f"a.{suffix}")
    audio = decode_file(path, Limits())
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(audio.size / SAMPLE_RATE - samples.size / rate) < 0.1  # codec padding only
    assert 0.05 < float(np.abs(audio).max()) <= 1.0


def test_stereo_is_mixed_down(tmp_path: Path) -> None:
    import av

    path = tmp_path / "stereo.wav"
    with av.open(str(path), mode="w") as out:
        stream = out.add_stream("pcm_s16le", rate=SAMPLE_RATE, layout="stereo")
        tone = (np.sin(np.arange(SAMPLE_RATE) / 10) * 8000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(np.stack([tone, tone]).reshape(1, -1), "s16", "stereo")
        frame.sample_rate = SAMPLE_RATE
        for packet in (*stream.encode(frame), *stream.encode(None)):
            out.mux(packet)
    audio = decode_file(path, Limits())
    assert audio.size == SAMPLE_RATE


def test_duration_limit_names_the_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, silence(3.0), "long.wav")
    with pytest.raises(InputError) as caught:
        decode_file(path, Limits(audio_max_seconds=2.0))
    assert caught.value.field == "audio"
    assert "limits.audio_max_seconds" in caught.value.reason
    assert decode_file(path, Limits(audio_max_seconds=3.5)).size == 3 * SAMPLE_RATE


def test_duration_limit_holds_without_a_header(tmp_path: Path) -> None:
    # An ADTS-less raw mp3 stream has no duration header: the decoded samples are counted.
    samples, rate = speech(SHORT)
    path = _write(tmp_path, encode(samples, rate, "mp3"), "a.mp3")
    with pytest.raises(InputError, match="audio_max_seconds"):
        decode_file(path, Limits(audio_max_seconds=1.0))


def test_byte_limit_is_too_large(tmp_path: Path) -> None:
    path = _write(tmp_path, spoken(SHORT, "wav"), "a.wav")
    with pytest.raises(TooLarge) as caught:
        decode_file(path, Limits(audio_max_bytes=1000))
    assert "limits.audio_max_bytes" in caught.value.reason


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "is empty"),
        (b"this is not audio at all, just some text\n" * 50, "could not be decoded"),
        (bytes(np.random.default_rng(1).integers(0, 256, 50_000, dtype=np.uint8)), "decoded"),
    ],
)
def test_undecodable_input_is_an_input_error(tmp_path: Path, data: bytes, reason: str) -> None:
    path = _write(tmp_path, data, "bad.mp3")
    with pytest.raises(InputError, match=reason) as caught:
        decode_file(path, Limits())
    assert caught.value.field == "audio"


def test_a_file_without_audio_samples_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    with wave.open(str(path), "wb") as out:  # a valid header and not one sample
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
    with pytest.raises(InputError, match="no audio"):
        decode_file(path, Limits())


def test_quiet_cut_lands_in_a_pause() -> None:
    rng = np.random.default_rng(0)
    audio = rng.normal(0, 0.3, 40 * SAMPLE_RATE).astype(np.float32)
    audio[int(11.2 * SAMPLE_RATE) : int(11.6 * SAMPLE_RATE)] = 0.0
    cut = quiet_cut(audio, 10.0)
    assert cut is not None and 1120 <= cut <= 1160
    assert quiet_cut(audio[: 30 * SAMPLE_RATE], 10.0) is None  # one window: no cut
    assert quiet_cut(audio, 0.0) is None
