"""How much device memory one worker of a pipeline needs, estimated before loading it.

The rule of thumb: the weights (parameter count x bytes per parameter at the dtype the
pipeline runs in) x 1.2 for activations, caches and the CUDA context. In order:

1. the pipeline's `memory_gb` (GiB, weights and overhead together) when it sets one;
2. the model's files, where `model` is a local directory or file, or a hub id already in
   the local hub cache: safetensors headers give the parameter count and stored dtype of
   every tensor (8 bytes of length and a JSON header, no weights read); other weight
   files (`.bin`, `.pt`, `.onnx`, a CTranslate2 `model.bin`) count by their size;
3. otherwise unknown (0): placement warns and counts nothing for it.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from jobs.settings import PipelineConfig

log = logging.getLogger(__name__)

OVERHEAD = 1.2
GIB = 1024**3
HEADER_MAX_BYTES = 100 * 1024 * 1024

DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
RUN_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "int8": 1, "int8_float16": 1, "int8_bfloat16": 1, "int8_float32": 1, "fp8": 1,
}  # fmt: skip
"""Bytes per float parameter at a pipeline's `options.dtype` / `options.compute_type`."""
OTHER_WEIGHTS = {".bin", ".pt", ".pth", ".ckpt", ".onnx", ".gguf"}


@dataclass(frozen=True)
class Estimate:
    bytes: int
    """Device memory of one worker process; 0 when unknown."""
    source: str
    """Where the figure comes from, for the plan and errors."""

    @property
    def known(self) -> bool:
        return self.bytes > 0

    @property
    def gib(self) -> float:
        return self.bytes / GIB


def estimate(config: PipelineConfig, on_gpu: bool = True) -> Estimate:
    """The memory of one worker of `config` (see the module docstring)."""
    if config.memory_gb is not None:
        return Estimate(int(config.memory_gb * GIB), "memory_gb")
    path = local_model(config.model)
    if path is None:
        why = f"no local files for {config.model!r}" if config.model else "no model path"
        return Estimate(0, f"unknown: {why}")
    dtypes = [str(config.options.get(name, "")) for name in ("dtype", "compute_type")]
    weights, how = weight_bytes(path, run_dtype_bytes(dtypes, on_gpu))
    if weights == 0:
        return Estimate(0, f"unknown: no weight files in {path}")
    return Estimate(int(weights * OVERHEAD), f"{how} x {OVERHEAD}")


def run_dtype_bytes(dtypes: Iterable[str], on_gpu: bool) -> int | None:
    """Bytes per float parameter once loaded, by the first of the options' `dtypes`
    (`dtype`, then `compute_type`) that says; None: as stored."""
    for dtype in dtypes:
        value = dtype.lower()
        if value in RUN_DTYPE_BYTES:
            return RUN_DTYPE_BYTES[value]
        if value == "auto" and on_gpu:
            return 2
    return None


def weight_bytes(path: Path, dtype_bytes: int | None) -> tuple[int, str]:
    """Bytes of the weights under `path` (a file or a directory), and how they were found."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    tensors = [f for f in files if f.suffix == ".safetensors"]
    params = 0
    total = 0
    for file in tensors:
        counted = safetensors_params(file)
        params += sum(counted.values())
        total += sum(
            n * (dtype_bytes if dtype_bytes and dtype in FLOAT_DTYPES else DTYPE_BYTES[dtype])
            for dtype, n in counted.items()
        )
    if tensors:
        return total, f"{params / 1e9:.3g}B parameters from safetensors headers"
    others = [f for f in files if f.suffix in OTHER_WEIGHTS]
    size = sum(f.stat().st_size for f in others)
    return size, f"{size / GIB:.3g} GiB of weight files"


def safetensors_params(path: Path) -> dict[str, int]:
    """Parameter count per stored dtype, from the file's header alone."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > HEADER_MAX_BYTES:
            raise ValueError(f"{path}: safetensors header of {length} bytes")
        header = json.loads(f.read(length))
    counts: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        counts[info["dtype"]] = counts.get(info["dtype"], 0) + math.prod(info["shape"])
    return counts


def local_model(model: str) -> Path | None:
    """The model's files: a local path, or a hub id already in the local hub cache
    (never a download); None otherwise."""
    if not model:
        return None
    path = Path(model).expanduser()
    if path.exists():
        return path
    if model.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:  # the local cache only: never a download
        return Path(snapshot_download(model, local_files_only=True))
    except (ValueError, OSError):  # not cached (LocalEntryNotFoundError), or not an id
        return None
