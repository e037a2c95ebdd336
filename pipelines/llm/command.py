"""What engine to start, and its command line: `vllm serve` or `transformers serve` with the
pipeline's knobs and the sequences and context that fit its device (`pipelines.llm.sizing`).
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from jobs.schemas.llm import LlmOptions
from jobs.settings import on_gpu
from pipelines.llm.memory import ShapeUnknown, device_memory, model_shape
from pipelines.llm.sizing import BLOCK_TOKENS, DEFAULT_CONTEXT_TOKENS, EngineSize, size_engine
from pipelines.llm.startup import EngineStartError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineSpec:
    """What to start: a model, on a device, with the pipeline's options."""

    pipeline: str
    model: str
    device: str
    options: LlmOptions
    data_dir: Path
    memory_cap_bytes: int | None = None
    """The pipeline's `memory_gb`: the most the engine is sized for, weights included."""
    sleeps: bool = False
    """Started in vLLM's sleep mode: an unload puts it to sleep (`EngineServer.sleep`)."""

    @property
    def served_name(self) -> str:
        return self.options.served_model_name or self.model

    @property
    def on_gpu(self) -> bool:
        return on_gpu(self.device)


def engine_size(spec: EngineSpec) -> EngineSize | None:
    """The sequences and context that fit the device, logged in one line; None (the
    engine starts with the options as they are) where memory or the model's shape cannot
    be read. Raises EngineDoesNotFit when not even one sequence fits."""
    memory = device_memory(spec.device, spec.options, spec.memory_cap_bytes)
    try:
        shape = model_shape(spec.model, spec.options, spec.on_gpu)
    except ShapeUnknown as exc:
        log.warning("engine %s: not sized (%s)", spec.pipeline, exc)
        return None
    if memory is None:
        log.warning("engine %s: not sized (no memory reading for %s)", spec.pipeline, spec.device)
        return None
    size = size_engine(spec.options.engine, memory, shape, spec.options)
    log.info("engine %s sized: %s", spec.pipeline, size.describe())
    return size


def engine_command(spec: EngineSpec, port: int, size: EngineSize | None = None) -> list[str]:
    """The engine server's argv for `spec`, listening on 127.0.0.1:`port`."""
    opts = spec.options
    if opts.engine == "vllm":
        return _vllm(spec, port, size) + opts.extra_args
    if opts.engine == "transformers":
        return _transformers(spec, port, size) + opts.extra_args
    raise ValueError(f"engine {opts.engine!r} is not started by mmq")


def _vllm(spec: EngineSpec, port: int, size: EngineSize | None) -> list[str]:
    opts = spec.options
    argv = [_executable(opts, "vllm"), "serve", spec.model, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", spec.served_name]
    seqs = size.sequences if size else opts.max_num_seqs or opts.max_inflight
    argv += ["--max-num-seqs", str(seqs)]
    argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
    argv += ["--dtype", opts.dtype]
    argv.append("--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching")
    max_model_len = size.context if size else opts.max_model_len
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if opts.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(opts.max_num_batched_tokens)]
    if opts.quantization:
        argv += ["--quantization", opts.quantization]
    if opts.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", opts.tool_call_parser]
    if spec.sleeps:
        argv.append("--enable-sleep-mode")
    return argv


def _transformers(spec: EngineSpec, port: int, size: EngineSize | None) -> list[str]:
    opts = spec.options
    device = "cuda:0" if spec.on_gpu else "cpu"
    argv = [_executable(opts, "transformers"), "serve", spec.model, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--device", device, "--dtype", opts.dtype]
    argv += ["--continuous-batching", "--log-level", "info"]
    if not spec.on_gpu:
        argv.append("--no-cb-use-cuda-graph")
    if size is not None:
        # Sized by mmq against the memory it may have: the engine's own check (a share
        # of the machine's memory, 0.6 of RAM on a CPU) must not refuse what fits.
        blocks, batch = size.blocks, size.batch_tokens
        argv += ["--cb-max-memory-percent", "1.0"]
    else:
        seqs = opts.max_num_seqs or opts.max_inflight
        blocks = -(-seqs * (opts.max_model_len or DEFAULT_CONTEXT_TOKENS) // BLOCK_TOKENS)
        batch = opts.max_num_batched_tokens or 0
    argv += ["--cb-block-size", str(BLOCK_TOKENS), "--cb-num-blocks", str(blocks)]
    if batch:
        argv += ["--cb-max-batch-tokens", str(batch)]
    if opts.quantization:
        argv += ["--quantization", opts.quantization]
    return argv


def _executable(opts: LlmOptions, name: str) -> str:
    if opts.engine_bin:
        return opts.engine_bin
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise EngineStartError(
            f"`{name}` is not installed here: set options.engine_bin to its executable "
            "(e.g. from vLLM's own environment) or options.engine_url to a running engine"
        )
    return found
