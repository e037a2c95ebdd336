"""How many sequences of how many tokens an engine's KV cache holds on its device.

Pure arithmetic over what `pipelines.llm.memory` reads (the device's memory, the model's
config.json and weights), so it can be checked for any device and model by hand:

    KV bytes per token = 2 (K, V) x layers x kv_heads x head_dim x dtype bytes
    room for the cache = memory the engine may have - weights - margin - fixed buffers
    tokens that fit    = room // bytes per cached token

Memory: on a CPU the least of MemAvailable, the cgroup's room and the allowed NUMA nodes'
MemTotal; on a GPU NVML's free memory x `gpu_memory_utilization`; never more than the
pipeline's `memory_gb`. Margin: the engine's own runtime (1 GiB), plus 5 % of RAM on a
CPU or the activations of one batch on a GPU.

`vllm serve` sizes its KV cache itself from `--gpu-memory-utilization`; what it is given is
a `--max-model-len` and `--max-num-seqs` that fit. `transformers serve` (5.23) allocates
`--cb-num-blocks` blocks and, with sdpa or eager attention (always on a CPU), buffers
that grow with the cache: its read-back copy of K and V for every head, and an attention
mask of `batch tokens x (cache tokens + batch tokens)` elements. That mask is what made 48
sequences x 4096 tokens of a tiny model ask for 6.9 GB: a batch of 8192 tokens (its default)
times 200 000 cache tokens. So mmq also sets its batch (`--cb-max-batch-tokens`) small on
a CPU, and counts those buffers per cached token.

When `max_inflight` sequences of the full context (`max_model_len`, else the model's
`max_position_embeddings`) do not fit: without a `max_model_len` from the user the context
per sequence shrinks (down to MIN_CONTEXT_TOKENS), else the engine's sequences do (the rest
wait inside the engine; `max_inflight` stays the admission limit). When not even one
sequence fits, `EngineDoesNotFit` says why before any engine starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jobs.schemas.llm_options import LlmOptions
from pipelines.llm.startup import EngineStartError

GIB = 1024**3
BLOCK_TOKENS = 32
"""Tokens per KV block (`--cb-block-size`); contexts are whole blocks."""
DEFAULT_CONTEXT_TOKENS = 4096
"""Context when neither `max_model_len` nor the model's config gives one."""
MIN_CONTEXT_TOKENS = 2048
"""Below this, mmq runs fewer sequences rather than shorter ones."""
CPU_BATCH_TOKENS = 512
GPU_BATCH_TOKENS = 2048
"""`transformers serve` tokens per forward step unless `max_num_batched_tokens` says."""
VLLM_BATCH_TOKENS = 8192
"""vLLM's batch for the activation estimate unless `max_num_batched_tokens` says."""
RUNTIME_BYTES = GIB
"""The engine process itself: Python, torch, CUDA context, tokenizer."""
CPU_MARGIN = 0.05
"""Share of RAM left to everything else on the machine."""
INDEX_BYTES = 8
"""transformers: int64 read index per cached token."""
IO_BYTES_PER_BATCH_TOKEN = 7 * 4 + 4 + 32 * 4 + 2 * 8
"""transformers: packed inputs, output ids, block table and write/read indices per batch
token (int32 / int64)."""
LOGIT_ROWS = 1024
"""transformers: logit rows it reserves for the requests of one batch."""


class EngineDoesNotFit(EngineStartError):
    """Not even one sequence fits in the memory the engine may have."""


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's KV cache, from its config.json and weight files."""

    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    dtype_bytes: int
    """Bytes per element of the KV cache and activations."""
    weight_bytes: int
    max_positions: int | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class Memory:
    """The memory an engine may have on its device, weights included."""

    bytes: int
    on_gpu: bool
    source: str
    """How it was read, for the log: "MemAvailable 22.6 GiB, NUMA 9.6 GiB"."""


@dataclass(frozen=True)
class EngineSize:
    """What mmq asks of the engine, and the numbers it came from."""

    engine: str
    memory: Memory
    shape: ModelShape
    margin_bytes: int
    fixed_bytes: int
    """Buffers that do not grow with the cache (transformers: one batch's activations)."""
    token_bytes: int
    """Bytes per cached token: KV, and transformers' buffers that grow with the cache."""
    sequences: int
    context: int
    batch_tokens: int
    reduced: str = ""
    """What was cut to fit, and why; empty when everything asked for fits."""

    @property
    def cache_tokens(self) -> int:
        return self.sequences * self.context

    @property
    def blocks(self) -> int:
        return -(-self.cache_tokens // BLOCK_TOKENS)

    @property
    def engine_bytes(self) -> int:
        """What the engine allocates beside its weights, by this estimate."""
        return self.fixed_bytes + self.token_bytes * self.blocks * BLOCK_TOKENS

    def describe(self) -> str:
        """The numbers in one line, for the worker log."""
        shape = self.shape
        line = (
            f"{self.engine} on {'GPU' if self.memory.on_gpu else 'CPU'}: memory "
            f"{_gib(self.memory.bytes)} ({self.memory.source}) - weights "
            f"{_gib(shape.weight_bytes)} - margin {_gib(self.margin_bytes)}; KV "
            f"{shape.kv_bytes_per_token} B/token ({shape.layers} layers x {shape.kv_heads} kv "
            f"heads x {shape.head_dim} x {shape.dtype_bytes} B x 2)"
        )
        if self.token_bytes != shape.kv_bytes_per_token:
            line += f", {self.token_bytes} B/token with the engine's buffers"
        line += (
            f"; {self.sequences} sequences x {self.context} tokens = {self.blocks} blocks of "
            f"{BLOCK_TOKENS} ({_gib(self.engine_bytes)}), batch {self.batch_tokens} tokens"
        )
        return line + (f"; {self.reduced}" if self.reduced else "")


def size_engine(engine: str, memory: Memory, shape: ModelShape, options: LlmOptions) -> EngineSize:
    """The sequences and context that fit (see the module docstring); raises
    EngineDoesNotFit when not even one sequence does."""
    want = options.max_num_seqs or options.max_inflight
    full = options.max_model_len or shape.max_positions or DEFAULT_CONTEXT_TOKENS
    batch = _batch_tokens(engine, memory, options)
    token_bytes, fixed = _costs(engine, shape, batch)
    margin = _margin(engine, memory, shape, batch)
    room = memory.bytes - shape.weight_bytes - margin - fixed
    fits = max(0, room) // token_bytes
    size = EngineSize(engine, memory, shape, margin, fixed, token_bytes, want, full, batch)
    if want * _whole_blocks(full) <= fits:
        return size
    if options.max_model_len is None:
        context = fits // want // BLOCK_TOKENS * BLOCK_TOKENS
        floor = min(full, MIN_CONTEXT_TOKENS)
        if context >= floor:
            why = f"context cut to {context} tokens a sequence (from {full}) to fit {want}"
            return replace(size, context=context, reduced=why)
        full = floor
    sequences = fits // _whole_blocks(full)
    if sequences >= 1:
        why = f"sequences cut to {sequences} (from {want}) of {full} tokens; the rest wait"
        return replace(size, sequences=sequences, context=full, reduced=why + " in the engine")
    raise EngineDoesNotFit(_too_big(size, full, room))


def _whole_blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS) * BLOCK_TOKENS


def _batch_tokens(engine: str, memory: Memory, options: LlmOptions) -> int:
    if options.max_num_batched_tokens:
        return options.max_num_batched_tokens
    if engine == "vllm":
        return VLLM_BATCH_TOKENS
    return GPU_BATCH_TOKENS if memory.on_gpu else CPU_BATCH_TOKENS


def _costs(engine: str, shape: ModelShape, batch: int) -> tuple[int, int]:
    """(bytes per cached token, fixed bytes) of the engine's cache and its buffers."""
    kv = shape.kv_bytes_per_token
    if engine == "vllm":
        return kv, 0  # vLLM's activations are in the margin
    a = shape.dtype_bytes
    read_heads = 2 * shape.heads + shape.kv_heads  # K repeated per head, and V
    per_token = kv + read_heads * shape.head_dim * a + INDEX_BYTES + batch * a
    attention = shape.hidden + (shape.heads + 2 * shape.kv_heads + read_heads) * shape.head_dim
    logits_row = shape.hidden * a + shape.vocab * 4  # fp32 logits of one request
    peak = max(logits_row, attention * a)
    fixed = batch * (peak + IO_BYTES_PER_BATCH_TOKEN) + batch * batch * a
    fixed += LOGIT_ROWS * logits_row + 2 * BLOCK_TOKENS * kv  # and two spare blocks
    return per_token, fixed


def _margin(engine: str, memory: Memory, shape: ModelShape, batch: int) -> int:
    if not memory.on_gpu:
        return RUNTIME_BYTES + int(memory.bytes * CPU_MARGIN)
    if engine == "vllm":  # one batch through the MLP: its activation peak
        per_token = (4 * shape.hidden + 4 * shape.intermediate) * shape.dtype_bytes
        return RUNTIME_BYTES + batch * per_token
    return RUNTIME_BYTES


def _too_big(size: EngineSize, context: int, room: int) -> str:
    need = size.token_bytes * _whole_blocks(context)
    return (
        f"the model does not fit: one sequence of {context} tokens needs {_gib(need)} of KV "
        f"cache and buffers ({size.token_bytes} B/token) and {_gib(max(0, room))} is left of "
        f"{_gib(size.memory.bytes)} ({size.memory.source}) after weights "
        f"{_gib(size.shape.weight_bytes)}, margin {_gib(size.margin_bytes)} and buffers "
        f"{_gib(size.fixed_bytes)}; lower options.max_model_len"
    )


def _gib(n: int) -> str:
    if abs(n) < GIB // 10:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / GIB:.1f} GiB"
