"""Coqui TTS (PyPI `coqui-tts`, import name `TTS`): VITS, XTTS and the other Coqui models.

A voice names a model (`tts_models/en/ljspeech/vits`, found in Coqui's cache) or a local
checkpoint with its `config.json`; both load through `TTS.api.TTS`, as users load them.

- VITS and most models: one chunk per sentence; speed is the model's `length_scale`.
- XTTS: `inference_stream` yields audio inside a sentence as the GPT decodes it. The
  voice is a reference clip (`reference_audio`, a stored file) or one of the model's
  built-in speakers (`speaker`). The clip is decoded with PyAV, not `torchaudio.load`,
  which needs torchcodec's native libraries (absent on CPU installs: see
  the torchaudio step of scripts/install.sh).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from jobs.errors import InputError
from jobs.schemas.tts import VoiceSpec
from pipelines.tts.encode import decode_file
from pipelines.tts.engines import SpeakOptions, to_int16


class CoquiEngine:
    engine = "coqui"

    def __init__(self, spec: VoiceSpec, device: str, threads: int) -> None:
        self.spec = spec
        self.device = device
        self.threads = threads
        self.sample_rate = 0
        self.native_speed = False
        self.clones = False
        self._tts: Any = None
        self._xtts = False
        self._base_length_scale = 1.0
        # Speed is a model attribute (`length_scale`): one synthesis at a time per model.
        self._lock = threading.Lock()

    def load(self) -> None:
        import torch
        from TTS.api import TTS

        if self.threads:
            torch.set_num_threads(self.threads)
        if self.spec.model is None:
            raise ValueError("a coqui voice needs `model` (a model name or a checkpoint path)")
        if self.spec.config:
            tts = TTS(model_path=self.spec.model, config_path=self.spec.config, progress_bar=False)
        else:
            tts = TTS(self.spec.model, progress_bar=False)
        self._tts = tts.to(self.device)
        model = tts.synthesizer.tts_model
        self.sample_rate = int(tts.synthesizer.output_sample_rate)
        self._xtts = type(model).__name__ == "Xtts"
        self.clones = self._xtts
        self.native_speed = self._xtts or hasattr(model, "length_scale")
        self._base_length_scale = float(getattr(model, "length_scale", 1.0))

    def sentence_limit(self, language: str | None) -> int | None:
        if not self._xtts:
            return None
        # XTTS warns past these and asserts past `gpt_max_text_tokens`.
        limits = self._tts.synthesizer.tts_model.tokenizer.char_limits
        return int(limits.get((language or self.spec.language or "en").split("-")[0], 250))

    def speak(self, sentence: str, options: SpeakOptions) -> Iterator[np.ndarray]:
        if self._tts is None:
            raise RuntimeError("the Coqui model is not loaded")
        if self._xtts:
            yield from self._speak_xtts(sentence, options)
            return
        with self._lock:
            model = self._tts.synthesizer.tts_model
            if hasattr(model, "length_scale"):
                model.length_scale = self._base_length_scale / options.speed
            wave = self._tts.tts(
                sentence,
                speaker=self.spec.speaker if self._tts.is_multi_speaker else None,
                language=self._language(options) if self._tts.is_multi_lingual else None,
                split_sentences=False,
            )
        yield to_int16(_without_pad(wave))

    def _language(self, options: SpeakOptions) -> str:
        return options.language or self.spec.language or "en"

    def _speak_xtts(self, sentence: str, options: SpeakOptions) -> Iterator[np.ndarray]:
        import torch

        model = self._tts.synthesizer.tts_model
        config = model.config
        gpt_latent, speaker_embedding = self._xtts_voice(model, options.reference)
        with torch.inference_mode():
            for chunk in model.inference_stream(
                sentence,
                self._language(options),
                gpt_latent,
                speaker_embedding,
                speed=options.speed,
                temperature=config.temperature,
                length_penalty=config.length_penalty,
                repetition_penalty=config.repetition_penalty,
                top_k=config.top_k,
                top_p=config.top_p,
                enable_text_splitting=False,
            ):
                yield to_int16(chunk)

    def _xtts_voice(self, model: Any, reference: Path | None) -> tuple[Any, Any]:
        """(GPT conditioning latents, speaker embedding) of the clip or built-in speaker."""
        import torch

        if reference is None:
            speakers = model.speaker_manager.speakers if model.speaker_manager else {}
            if self.spec.speaker not in speakers:
                raise InputError("reference_audio", "this voice clones: send a reference clip")
            latents = speakers[self.spec.speaker]
            return latents["gpt_cond_latent"], latents["speaker_embedding"]
        config = model.config
        rate = int(config.audio.sample_rate)
        try:
            samples = decode_file(str(reference), rate, float(config.max_ref_len))
        except Exception as exc:  # PyAV raises many types for a file that is not audio
            raise InputError("reference_audio", f"could not decode the clip ({exc})") from exc
        if samples.size < rate:
            raise InputError("reference_audio", "the clip must hold at least a second of audio")
        audio = torch.from_numpy(samples).unsqueeze(0).to(model.device)
        with torch.inference_mode():
            embedding = model.get_speaker_embedding(audio, rate)
            gpt_latent = model.get_gpt_cond_latents(
                audio, rate, length=config.gpt_cond_len, chunk_length=config.gpt_cond_chunk_len
            )
        return gpt_latent, embedding

    def unload(self) -> None:
        self._tts = None


def _without_pad(wave: list[float]) -> list[float]:
    """The sentence without the fixed silence Coqui's synthesizer appends to each one
    (its own sentence joiner's pause, the same length at any rate or speed)."""
    from TTS.utils.synthesizer import PAD_SILENCE_SAMPLES

    tail = wave[-PAD_SILENCE_SAMPLES:]
    if len(wave) > PAD_SILENCE_SAMPLES and not any(tail):
        return wave[:-PAD_SILENCE_SAMPLES]
    return wave
