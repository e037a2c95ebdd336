"""Decoding any audio that PyAV (FFmpeg) reads into 16 kHz mono float32, within limits.

wav, flac, mp3, ogg/opus, m4a/aac, webm... anything with an audio stream. Every problem
is an `InputError` naming the input field (`TooLarge` for the byte limit), so the job
fails as bad input, is never retried, and the worker goes on.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np

from jobs.errors import InputError, TooLarge
from jobs.settings import Limits

SAMPLE_RATE = 16000


def decode_file(path: Path, limits: Limits, field: str = "audio") -> np.ndarray:
    """The audio of `path` as 16 kHz mono float32 in [-1, 1]."""
    size = path.stat().st_size
    if size > limits.audio_max_bytes:
        raise TooLarge(
            field,
            f"is {size} bytes, over the limit of {limits.audio_max_bytes} bytes "
            "(limits.audio_max_bytes)",
        )
    if size == 0:
        raise InputError(field, "is empty")
    try:
        samples = _decode(path, limits.audio_max_seconds, field)
    except av.FFmpegError as exc:  # its str() names the file: say only what went wrong
        reason = exc.strerror or type(exc).__name__
        raise InputError(field, f"could not be decoded as audio ({reason})") from None
    finally:
        gc.collect()  # PyAV's resampler graphs are freed only by a collection
    if samples.size == 0:
        raise InputError(field, "contains no audio samples")
    return samples


def _decode(path: Path, max_seconds: float, field: str) -> np.ndarray:
    with av.open(str(path), mode="r", metadata_errors="ignore") as container:
        if not container.streams.audio:
            raise InputError(field, "has no audio stream")
        stream = container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            _check_seconds(float(stream.duration * stream.time_base), max_seconds, field)
        elif container.duration is not None:
            _check_seconds(container.duration / av.time_base, max_seconds, field)
        resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
        parts: list[np.ndarray] = []
        total = 0
        max_samples = int(max_seconds * SAMPLE_RATE)
        for frame in _resampled(_valid_frames(container.decode(stream)), resampler):
            array = frame.to_ndarray().reshape(-1)
            total += array.size
            if total > max_samples:
                _check_seconds(total / SAMPLE_RATE, max_seconds, field)
            parts.append(array)
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts).astype(np.float32) / 32768.0


def _check_seconds(seconds: float, max_seconds: float, field: str) -> None:
    if seconds > max_seconds:
        raise InputError(
            field,
            f"is {seconds:.1f} s long, over the limit of {max_seconds:g} s "
            "(limits.audio_max_seconds)",
        )


def _valid_frames(frames: Iterator[av.AudioFrame]) -> Iterator[av.AudioFrame]:
    """Frames, skipping those FFmpeg calls invalid (a damaged packet mid-file)."""
    while True:
        try:
            frame = next(frames)
        except StopIteration:
            return
        except av.InvalidDataError:
            continue
        frame.pts = None  # resample whatever the timestamps say
        yield frame


def _resampled(
    frames: Iterator[av.AudioFrame], resampler: av.AudioResampler
) -> Iterator[av.AudioFrame]:
    for frame in itertools.chain(frames, [None]):
        yield from resampler.resample(frame)
