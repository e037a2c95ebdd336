"""What the sizing reads: the memory an engine may have on its device, and the shape of
its model (config.json and weight files).

CPU: the least of /proc/meminfo's MemAvailable, the cgroup's room (memory.max -
memory.current) and the MemTotal of the NUMA nodes this process may use (what
`transformers serve` measures itself against). GPU: NVML's free memory of the worker's
device (`host.devices`) x `gpu_memory_utilization`. Either is capped by the pipeline's
`memory_gb`. None where it cannot be read: the engine then starts unsized.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from host.devices import read_usage
from host.model_memory import RUN_DTYPE_BYTES, local_model, run_dtype_bytes, weight_bytes
from jobs.schemas.llm_options import LlmOptions
from jobs.settings import on_gpu
from pipelines.llm.sizing import GIB, Memory, ModelShape

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
NODES = Path("/sys/devices/system/node")
CONFIG_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class ShapeUnknown(ValueError):
    """The model's config.json is missing or lacks what the sizing needs."""


def device_memory(device: str, options: LlmOptions, cap_bytes: int | None) -> Memory | None:
    """The memory the engine may have on `device` (cpu, gpu:N, mig:UUID)."""
    gpu = on_gpu(device)
    found = _gpu_memory(device, options.gpu_memory_utilization) if gpu else _cpu_memory()
    if found is None or cap_bytes is None or cap_bytes >= found.bytes:
        return found
    return Memory(cap_bytes, found.on_gpu, f"memory_gb {cap_bytes / GIB:.3g} of {found.source}")


def _gpu_memory(device: str, utilization: float) -> Memory | None:
    usage = read_usage(device)
    if usage is None:
        return None
    free = usage.memory_total_bytes - usage.memory_used_bytes
    source = (
        f"NVML {device} {usage.name}: {free / GIB:.1f} GiB free of "
        f"{usage.memory_total_bytes / GIB:.1f} x gpu_memory_utilization {utilization}"
    )
    return Memory(int(free * utilization), True, source)


def _cpu_memory() -> Memory | None:
    info = meminfo_bytes(MEMINFO.read_text()) if MEMINFO.exists() else {}
    if "MemAvailable" not in info:
        return None
    found = {"MemAvailable": info["MemAvailable"]}
    room = _cgroup_room()
    if room is not None:
        found["cgroup"] = room
    numa = _numa_total()
    if numa is not None and numa < info.get("MemTotal", numa + 1):
        found["NUMA nodes"] = numa
    source = ", ".join(f"{name} {n / GIB:.1f} GiB" for name, n in found.items())
    return Memory(min(found.values()), False, source)


def meminfo_bytes(text: str) -> dict[str, int]:
    """`Name: N kB` lines (of /proc/meminfo or a NUMA node's meminfo) in bytes."""
    out = {}
    for match in re.finditer(r"^(?:Node \d+ )?(\w+):\s+(\d+) kB", text, re.MULTILINE):
        out[match[1]] = int(match[2]) * 1024
    return out


def _cgroup_room() -> int | None:
    try:
        limit = (CGROUP / "memory.max").read_text().strip()
        current = int((CGROUP / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def _numa_total() -> int | None:
    """MemTotal of the NUMA nodes this process may allocate on."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.MULTILINE)
    if match is None:
        return None
    total = 0
    for node in _ranges(match[1]):
        try:
            text = (NODES / f"node{node}" / "meminfo").read_text()
        except OSError:
            return None
        total += meminfo_bytes(text).get("MemTotal", 0)
    return total or None


def _ranges(spec: str) -> list[int]:
    nodes: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        nodes += range(int(low), int(high or low) + 1)
    return nodes


def model_shape(model: str, options: LlmOptions, on_gpu: bool) -> ModelShape:
    """The model's shape from its config.json, and its weights' bytes once loaded."""
    path = local_model(model)
    if path is None or not (path / "config.json").is_file():
        raise ShapeUnknown(f"no local config.json for {model!r}")
    config = json.loads((path / "config.json").read_text())
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}  # a multimodal model's language part
    weights, _ = weight_bytes(path, run_dtype_bytes([options.dtype], on_gpu))
    stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return shape_from_config(config, _dtype_bytes(stored, options.dtype, on_gpu), weights)


# config.json is the model's own JSON, read as it is: its names differ from one
# architecture to the next (`num_hidden_layers`, `n_layer`...).
def shape_from_config(config: dict[str, Any], dtype_bytes: int, weights: int) -> ModelShape:
    """A ModelShape from a transformers config.json's fields."""

    def first(*names: str) -> int | None:
        """The first of `names` that the config sets, as a number."""
        found = next((config[name] for name in names if config.get(name) is not None), None)
        return None if found is None else int(found)

    def required(*names: str) -> int:
        found = first(*names)
        if found is None:
            raise ShapeUnknown(f"config.json has no {names[0]}")
        return found

    layers = required("num_hidden_layers", "n_layer", "num_layers")
    heads = required("num_attention_heads", "n_head")
    hidden = required("hidden_size", "n_embd", "d_model")
    kv_heads = int(config.get("num_key_value_heads") or (1 if config.get("multi_query") else heads))
    positions = first("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    return ModelShape(
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=int(config.get("head_dim") or hidden // heads),
        hidden=hidden,
        intermediate=int(config.get("intermediate_size") or 4 * hidden),
        vocab=int(config.get("vocab_size") or 0),
        dtype_bytes=dtype_bytes,
        weight_bytes=weights,
        max_positions=positions or None,
    )


def _dtype_bytes(stored: str, dtype: str, on_gpu: bool) -> int:
    """Bytes per KV element: the options' dtype, else the config's `stored` one (16-bit on
    a GPU)."""
    if dtype.lower() in RUN_DTYPE_BYTES:
        return RUN_DTYPE_BYTES[dtype.lower()]
    size = CONFIG_DTYPE_BYTES.get(stored.removeprefix("torch."), 4)
    return min(size, 2) if on_gpu else size
