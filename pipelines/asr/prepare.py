"""From decoded audio to a decoding `Stream`: optional VAD, mel features, a short first
window; and back from the stream's times to the original audio's times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.vad import SpeechTimestampsMap, VadOptions, collect_chunks
from faster_whisper.vad import get_speech_timestamps as speech_timestamps

from jobs.outputs import Segment
from pipelines.asr.batch import Stream
from pipelines.asr.decode import SAMPLE_RATE
from pipelines.asr.options import DecodeOptions

SAMPLES_PER_FRAME = 160
WINDOW_S = 30.0
HOP = 800
"""50 ms of samples: the energy resolution of `quiet_cut`."""


@dataclass(eq=False)
class Prepared:
    stream: Stream
    duration_s: float
    speech_map: SpeechTimestampsMap | None = None
    """Where VAD removed silence: maps the stream's times back to the original ones."""

    def restore(self, segment: Segment) -> Segment:
        """The segment with times of the original audio (as `restore_speech_timestamps`)."""
        ts_map = self.speech_map
        if ts_map is None:
            return segment
        words = segment.get("words")
        if words:
            for word in words:
                chunk = ts_map.get_chunk_index((word["start"] + word["end"]) / 2)
                word["start"] = ts_map.get_original_time(word["start"], chunk)
                word["end"] = ts_map.get_original_time(word["end"], chunk)
            segment["start"], segment["end"] = words[0]["start"], words[-1]["end"]
        else:
            segment["start"] = ts_map.get_original_time(segment["start"])
            segment["end"] = ts_map.get_original_time(segment["end"], is_end=True)
        return segment


def prepare(
    model: WhisperModel, audio: np.ndarray, options: DecodeOptions, first_window_s: float
) -> Prepared:
    duration_s = audio.size / SAMPLE_RATE
    speech_map = None
    if options.vad_filter:
        chunks = speech_timestamps(audio, VadOptions())
        speech_map = SpeechTimestampsMap(chunks, SAMPLE_RATE) if chunks else None
        parts, _ = collect_chunks(audio, chunks) if chunks else ([], [])
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if audio.size == 0:  # nothing left to decode: an empty transcript
        features = np.zeros((model.model.n_mels, 1), dtype=np.float32)
    else:
        features = model.feature_extractor(audio)
    stream = Stream(features, options, first_cut=quiet_cut(audio, first_window_s))
    if options.initial_prompt:
        text = " " + options.initial_prompt.strip()
        stream.tokens = list(model.hf_tokenizer.encode(text, add_special_tokens=False).ids)
    return Prepared(stream, duration_s, speech_map)


def quiet_cut(audio: np.ndarray, target_s: float, span_s: float = 3.0) -> int | None:
    """The frame at the quietest 200 ms within `span_s` of `target_s`, where the first
    window should end; None for audio that fits one window (a short first window would
    cost it a second encoder pass) or when `target_s` is too small to search around."""
    if target_s <= span_s or audio.size <= max(WINDOW_S, 2 * target_s + span_s) * SAMPLE_RATE:
        return None
    lo = int((target_s - span_s) * SAMPLE_RATE)
    hi = int((target_s + span_s) * SAMPLE_RATE)
    region = audio[lo:hi]
    energy = np.square(region[: region.size // HOP * HOP]).reshape(-1, HOP).mean(axis=1)
    smooth = np.convolve(energy, np.ones(4) / 4, mode="valid")
    quietest = int(np.argmin(smooth)) + 2
    return (lo + quietest * HOP) // SAMPLES_PER_FRAME
