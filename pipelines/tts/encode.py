"""Audio out of the engines, with PyAV: speed, sample rate, and the five formats.

Engines give mono int16 chunks at their own rate. A `Shaper` turns them into the
request's audio (tempo change for engines without a native speed, resampling), chunk by
chunk and stateful, so the pieces join without clicks. A `StreamEncoder` turns the same
chunks into the bytes of a streamable file as they come (flac, mp3 and Ogg Opus: the
concatenation of its outputs is a playable file); `encode_file` writes the final file,
with its headers filled in.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from typing import Any

import av
import av.filter
import numpy as np

from jobs.schemas.tts import CONTENT_TYPES, AudioFormat


@dataclass(frozen=True)
class FormatSpec:
    container: str
    codec: str
    content_type: str
    extension: str
    options: tuple[tuple[str, str], ...] = ()


FORMATS: dict[str, FormatSpec] = {
    "wav": FormatSpec("wav", "pcm_s16le", CONTENT_TYPES["wav"], "wav"),
    "flac": FormatSpec("flac", "flac", CONTENT_TYPES["flac"], "flac"),
    "mp3": FormatSpec("mp3", "libmp3lame", CONTENT_TYPES["mp3"], "mp3"),
    # Short Ogg pages (100 ms), so that a streamed answer never waits a second per page.
    "opus": FormatSpec(
        "ogg", "libopus", CONTENT_TYPES["opus"], "opus", (("page_duration", "100000"),)
    ),
    "pcm": FormatSpec("", "", CONTENT_TYPES["pcm"], "pcm"),
}
STREAMED_FORMATS = frozenset({"flac", "mp3", "opus"})
"""Formats whose partial events carry their own stream bytes (wav and pcm are raw PCM)."""


def _frame(samples: np.ndarray, rate: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = rate
    return frame


def _samples(frames: list[av.AudioFrame]) -> np.ndarray:
    arrays = [f.to_ndarray().reshape(-1) for f in frames if f.samples]
    return np.concatenate(arrays).astype(np.int16) if arrays else np.zeros(0, np.int16)


class Shaper:
    """Tempo (`atempo`, for engines without a native speed) and sample rate, streamed."""

    def __init__(self, in_rate: int, out_rate: int, tempo: float = 1.0) -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._graph = _tempo_graph(in_rate, tempo) if abs(tempo - 1.0) > 1e-3 else None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)

    def feed(self, samples: np.ndarray) -> np.ndarray:
        if samples.size == 0:
            return np.zeros(0, np.int16)
        return self._after_tempo(self._tempo(_frame(samples, self.in_rate)))

    def flush(self) -> np.ndarray:
        return self._after_tempo(self._tempo(None))

    def _tempo(self, frame: av.AudioFrame | None) -> list[av.AudioFrame | None]:
        if self._graph is None:
            return [frame]
        self._graph.push(frame)
        frames: list[av.AudioFrame | None] = []
        while True:
            try:
                pulled = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                break
            if isinstance(pulled, av.AudioFrame):
                frames.append(pulled)
        return frames if frame is not None else [*frames, None]

    def _after_tempo(self, frames: list[av.AudioFrame | None]) -> np.ndarray:
        out: list[av.AudioFrame] = []
        for frame in frames:
            if frame is not None:
                frame.pts = None
            out.extend(self._resampler.resample(frame))
        return _samples(out)


def _tempo_graph(rate: int, tempo: float) -> av.filter.Graph:
    graph = av.filter.Graph()
    source = graph.add_abuffer(format="s16", sample_rate=rate, layout="mono")
    chain = [source]
    # atempo takes 0.5..2.0 per stage; chain stages for 0.25..4.
    while tempo > 2.0 or tempo < 0.5:
        step = 2.0 if tempo > 2.0 else 0.5
        chain.append(graph.add("atempo", str(step)))
        tempo /= step
    chain.append(graph.add("atempo", f"{tempo:.6f}"))
    chain.append(graph.add("abuffersink"))
    for left, right in itertools.pairwise(chain):
        left.link_to(right)
    graph.configure()
    return graph


def codec_rate(fmt: AudioFormat, rate: int) -> int:
    """The rate `fmt` is encoded at: `rate`, or the nearest one its codec supports."""
    spec = FORMATS[fmt]
    if not spec.codec:
        return rate
    rates = av.Codec(spec.codec, "w").audio_rates
    if not rates or rate in rates:
        return rate
    higher = [r for r in rates if r >= rate]
    return min(higher) if higher else max(rates)


class _Sink:
    """A write-only, unseekable file: muxers then write streamable output."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


class StreamEncoder:
    """Encodes PCM chunks to `fmt` incrementally; each call returns the new bytes."""

    def __init__(self, fmt: AudioFormat, rate: int) -> None:
        self.spec = FORMATS[fmt]
        self.rate = rate
        self._sink = _Sink()
        self._out = _open(self._sink, self.spec, codec_rate(fmt, rate))
        self._stream = self._out.streams.audio[0]

    def feed(self, samples: np.ndarray) -> bytes:
        if samples.size:
            for packet in self._stream.encode(_frame(samples, self.rate)):
                self._out.mux(packet)
        return self._sink.drain()

    def close(self) -> bytes:
        for packet in self._stream.encode(None):
            self._out.mux(packet)
        self._out.close()
        return self._sink.drain()


def _open(target: Any, spec: FormatSpec, rate: int) -> av.container.OutputContainer:
    out = av.open(target, "w", format=spec.container, options=dict(spec.options))
    out.add_stream(spec.codec, rate=rate, layout="mono")
    return out


def encode_file(samples: np.ndarray, rate: int, fmt: AudioFormat) -> bytes:
    """The whole audio as a file of format `fmt` (raw little-endian PCM16 for `pcm`)."""
    if fmt == "pcm":
        return np.ascontiguousarray(samples, dtype="<i2").tobytes()
    spec = FORMATS[fmt]
    buffer = io.BytesIO()
    out = _open(buffer, spec, codec_rate(fmt, rate))
    stream = out.streams.audio[0]
    packets = [*stream.encode(_frame(samples, rate)), *stream.encode(None)]
    for packet in packets:
        out.mux(packet)
    out.close()
    return buffer.getvalue()


def decode_file(path: str, rate: int, max_seconds: float) -> np.ndarray:
    """The first `max_seconds` of an audio file as mono float32 in [-1, 1] at `rate`."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    chunks: list[np.ndarray] = []
    total, limit = 0, int(rate * max_seconds)
    with av.open(path) as container:
        for frame in container.decode(audio=0):
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().reshape(-1))
                total += chunks[-1].size
            if total >= limit:
                break
        chunks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate(chunks)[:limit].astype(np.float32)
