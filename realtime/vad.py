"""Server-side voice activity detection (`server_vad`, issue 52): silero's ONNX model on
onnxruntime, fed a session's PCM16 as it arrives, and the turn logic that says where speech
starts and stops.

The model runs without torch: the ONNX file is read from the silero-vad wheel, whose package
is never imported (`import silero_vad` imports torch). `bench/vad.py` chose it and measures it.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import soxr

SAMPLE_RATE = 16_000
"""The model's rate."""
FRAME = 512
"""Samples per model run (32 ms)."""
CONTEXT = 64
"""Samples of the previous frame that the model sees before each frame."""
HYSTERESIS = 0.15
"""Speech ends on probabilities below threshold - 0.15, as silero's own iterator does."""

Floats = npt.NDArray[np.float32]


def silero_onnx_path() -> Path:
    """The ONNX file inside the silero-vad wheel, found without importing the package."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("silero-vad is not installed (the realtime extra)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"


class SileroModel:
    """One onnxruntime session on one thread; each stream keeps its own state, so streams
    share it (onnxruntime's `run` is thread-safe)."""

    def __init__(self) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session: Any = onnxruntime.InferenceSession(
            str(silero_onnx_path()), options, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def run(self, x: Floats, state: Floats) -> tuple[Floats, Floats]:
        """x: (batch, 64 + 512) float32, context then frame, at 16 kHz; state: (2, batch, 128).
        The speech probability of each row, and the next state."""
        prob, state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        return np.asarray(prob[:, 0], dtype=np.float32), np.asarray(state, dtype=np.float32)


_shared: SileroModel | None = None
_shared_lock = threading.Lock()


def shared_model() -> SileroModel:
    """The process's model, loaded on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SileroModel()
        return _shared


@dataclass(frozen=True)
class TurnDetection:
    """`server_vad`'s settings; the defaults are OpenAI's. `prefix_padding_ms` is the
    caller's (how much audio before `audio_start_ms` a turn keeps): the events ignore it."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


class VadEvent(NamedTuple):
    kind: Literal["speech_started", "speech_stopped"]
    audio_ms: int
    """From the start of the stream's audio: where speech began (`audio_start_ms`), or where
    the silence that ended it began (`audio_end_ms`)."""


class VadStream:
    """One session's audio in, its turns' edges out.

    Speech starts at the first frame whose probability reaches the threshold. It stops once
    `silence_duration_ms` have passed since a frame fell below threshold - 0.15 with no frame
    reaching the threshold since; frames in between neither start nor break the silence.
    """

    def __init__(
        self, detection: TurnDetection, input_rate: int = 24000, model: SileroModel | None = None
    ) -> None:
        self.detection = detection
        self.input_rate = input_rate
        self._model = model or shared_model()
        # float32 through soxr: its int16 output dithers (+-1 LSB, different on every run).
        self._resampler = soxr.ResampleStream(input_rate, SAMPLE_RATE, 1, dtype="float32")
        self._odd = b""
        self._samples_in = 0
        self._pending: Floats = np.zeros(0, np.float32)
        self._frames = 0
        self._window: Floats = np.zeros((1, CONTEXT + FRAME), np.float32)
        self._state: Floats = np.zeros((2, 1, 128), np.float32)
        self._in_speech = False
        self._silence_from: int | None = None

    @property
    def audio_ms(self) -> int:
        """Milliseconds of input audio pushed so far."""
        return self._samples_in * 1000 // self.input_rate

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    def reset(self) -> None:
        """Forget the turn (idle, no silence counted); the clock and the model's view of the
        audio so far stay."""
        self._in_speech = False
        self._silence_from = None

    def push(self, pcm16: bytes) -> list[VadEvent]:
        """Little-endian PCM16 mono of any length (an odd last byte waits for the next push);
        the events of every whole frame it completes."""
        data = self._odd + pcm16
        whole = len(data) & ~1
        self._odd = data[whole:]
        samples = np.frombuffer(data[:whole], dtype="<i2")
        if not len(samples):
            return []
        self._samples_in += len(samples)
        out = self._resampler.resample_chunk(samples.astype(np.float32) / np.float32(32768))
        self._pending = np.concatenate([self._pending, out.astype(np.float32, copy=False)])
        events: list[VadEvent] = []
        while len(self._pending) >= FRAME:
            event = self._step(self._pending[:FRAME])
            self._pending = self._pending[FRAME:]
            if event is not None:
                events.append(event)
        return events

    def _step(self, frame: Floats) -> VadEvent | None:
        self._window[0, :CONTEXT] = self._window[0, -CONTEXT:]
        self._window[0, CONTEXT:] = frame
        prob, self._state = self._model.run(self._window, self._state)
        start_ms = self._frames * FRAME * 1000 // SAMPLE_RATE
        self._frames += 1
        return self._turn(float(prob[0]), start_ms, self._frames * FRAME * 1000 // SAMPLE_RATE)

    def _turn(self, prob: float, start_ms: int, end_ms: int) -> VadEvent | None:
        threshold = self.detection.threshold
        if prob >= threshold:
            self._silence_from = None
            if not self._in_speech:
                self._in_speech = True
                return VadEvent("speech_started", start_ms)
            return None
        if not self._in_speech:
            return None
        if self._silence_from is None:
            if prob >= max(threshold - HYSTERESIS, 0.01):
                return None
            self._silence_from = start_ms
        if end_ms - self._silence_from < self.detection.silence_duration_ms:
            return None
        stopped = VadEvent("speech_stopped", self._silence_from)
        self.reset()
        return stopped
