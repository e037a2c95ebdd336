"""server_vad (realtime/vad.py) on real speech: the two SHORT sentences spoken by Piper, each
trimmed to its speech and spliced with silences of known length, so the true edges of speech
are known to 10 ms. The audio is streamed as the Realtime API sends it: PCM16 at 24 kHz in
20 ms appends, through silero's ONNX model."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr

from harness.audio import SHORT, speech
from realtime.vad import TurnDetection, VadEvent, VadStream

RATE = 24_000
APPEND = 960
"""Bytes in one 20 ms append at 24 kHz."""
LEAD_S = 0.5
TAIL_S = 1.0
TOLERANCE_MS = 250
"""How far from the speech's true edge, on the audio's own clock (ms into the stream, the
same every run for the same samples), VAD may place a turn's start or end: its accuracy,
not a speed."""
Floats = npt.NDArray[np.float32]


def _trim(pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
    """The speech in a sentence: its 10 ms frames within 40 dB of its loudest."""
    hop = rate // 100
    frames = pcm[: len(pcm) // hop * hop].reshape(-1, hop).astype(np.float64)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = np.flatnonzero(rms > rms.max() / 100)
    return pcm[loud[0] * hop : (loud[-1] + 1) * hop]


@functools.cache
def _sentences() -> tuple[Floats, Floats]:
    """Each SHORT sentence at 24 kHz, trimmed, as floats in [-1, 1]."""
    out = []
    for text in SHORT:
        pcm, rate = speech((text,))
        out.append(soxr.resample(_trim(pcm, rate).astype(np.float32) / 32768, rate, RATE))
    return out[0], out[1]


def _clip(gap_s: float, snr_db: float | None = None) -> tuple[bytes, list[int]]:
    """Silence, sentence, `gap_s` of silence, sentence, silence (white noise under it all at
    `snr_db` to the speech), as PCM16; and where speech starts, ends, starts, ends (ms)."""
    first, second = _sentences()
    silent = [np.zeros(int(s * RATE), np.float32) for s in (LEAD_S, gap_s, TAIL_S)]
    audio = np.concatenate([silent[0], first, silent[1], second, silent[2]])
    if snr_db is not None:
        power = float(np.mean(np.concatenate([first, second]) ** 2))
        noise = np.random.default_rng(52).standard_normal(len(audio))
        audio = audio + (noise * np.sqrt(power / 10 ** (snr_db / 10))).astype(np.float32)
    edges = np.cumsum([LEAD_S * RATE, len(first), gap_s * RATE, len(second)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    return pcm, [round(e * 1000 / RATE) for e in edges]


def _stream(stream: VadStream, pcm: bytes, size: int = APPEND) -> list[VadEvent]:
    return [e for i in range(0, len(pcm), size) for e in stream.push(pcm[i : i + size])]


def _assert_turns(events: list[VadEvent], edges: list[int]) -> None:
    kinds = ["speech_started", "speech_stopped"] * (len(edges) // 2)
    assert [e.kind for e in events] == kinds, events
    for event, edge in zip(events, edges, strict=True):
        assert abs(event.audio_ms - edge) <= TOLERANCE_MS, (event, edge)


def test_two_turns_at_their_edges() -> None:
    pcm, edges = _clip(gap_s=1.2)
    stream = VadStream(TurnDetection())
    _assert_turns(_stream(stream, pcm), edges)
    assert not stream.in_speech
    assert stream.audio_ms == len(pcm) // 2 * 1000 // RATE


def test_silence_gives_no_event() -> None:
    stream = VadStream(TurnDetection())
    assert _stream(stream, bytes(3 * RATE * 2)) == []
    assert not stream.in_speech
    assert stream.audio_ms == 3000


def test_noise_at_10_db_still_ends_the_turn() -> None:
    pcm, edges = _clip(gap_s=1.2, snr_db=10.0)
    _assert_turns(_stream(VadStream(TurnDetection()), pcm), edges)


def test_a_short_pause_does_not_end_the_turn() -> None:
    pcm, edges = _clip(gap_s=0.3)
    _assert_turns(_stream(VadStream(TurnDetection()), pcm), [edges[0], edges[3]])


def test_detection_changes_between_pushes() -> None:
    """The same 0.3 s pause ends the turn once the session asks for 150 ms of silence."""
    pcm, edges = _clip(gap_s=0.3)
    stream = VadStream(TurnDetection())
    events = stream.push(pcm[:APPEND])
    stream.detection = dataclasses.replace(stream.detection, silence_duration_ms=150)
    events += _stream(stream, pcm[APPEND:])
    _assert_turns(events, edges)


def test_pushes_of_any_length_give_the_same_events() -> None:
    pcm, _ = _clip(gap_s=1.2)
    expected = _stream(VadStream(TurnDetection()), pcm)
    stream = VadStream(TurnDetection())
    rng = np.random.default_rng(7)
    events: list[VadEvent] = []
    start = 0
    while start < len(pcm):
        size = int(rng.integers(1, 3001))  # odd half the time: a sample split between pushes
        events += stream.push(pcm[start : start + size])
        start += size
    assert events == expected
    assert stream.audio_ms == len(pcm) // 2 * 1000 // RATE


def test_reset_forgets_the_turn_not_the_clock() -> None:
    pcm, edges = _clip(gap_s=1.2)
    stream = VadStream(TurnDetection())
    middle = (edges[0] + edges[1]) // 2 * RATE // 1000 * 2
    assert [e.kind for e in _stream(stream, pcm[:middle])] == ["speech_started"]
    assert stream.in_speech
    at = stream.audio_ms
    stream.reset()
    assert not stream.in_speech
    assert stream.audio_ms == at
    events = _stream(stream, pcm[middle:])
    # The first frame after the reset may begin before it: up to a frame, and soxr's delay.
    assert at - 100 <= events[0].audio_ms <= at + TOLERANCE_MS, (events[0], at)
    _assert_turns(events, [events[0].audio_ms, *edges[1:]])


def test_torch_is_never_imported() -> None:
    code = (
        "import sys\n"
        "from realtime.vad import TurnDetection, VadStream\n"
        "stream = VadStream(TurnDetection())\n"
        "assert stream.push(bytes(48000)) == []\n"
        "assert 'torch' not in sys.modules and 'silero_vad' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)
