"""Which engine speaks a voice: the one place that knows every engine module (each is
imported only when a voice of it is loaded)."""

from __future__ import annotations

from jobs.schemas.tts import VoiceSpec
from pipelines.tts.engines import SpeechEngine


def device_of(device: str) -> str:
    """The torch/onnx device of a worker's `device` setting (`cpu`, `gpu:N`, `mig:UUID`).

    The launcher sets CUDA_VISIBLE_DEVICES to the worker's one device, so any GPU is `cuda`.
    """
    return "cpu" if device == "cpu" else "cuda"


def make_engine(spec: VoiceSpec, device: str, threads: int) -> SpeechEngine:
    """An unloaded engine for `spec` (imports its library only when chosen)."""
    if spec.engine == "piper":
        from pipelines.tts.piper import PiperEngine

        return PiperEngine(spec, device_of(device), threads)
    from pipelines.tts.coqui import CoquiEngine

    return CoquiEngine(spec, device_of(device), threads)
