"""Engine sizing by hand-written devices and models: the arithmetic of `pipelines.llm.sizing`,
what is read from a config.json and /proc/meminfo, and how an engine's fatal answers and
log lines are told apart from one still loading. No process is started here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from jobs.schemas.llm_options import LlmOptions
from jobs.settings import PipelineConfig
from pipelines.llm.command import EngineSpec, engine_command
from pipelines.llm.memory import meminfo_bytes, shape_from_config
from pipelines.llm.sizing import GIB, EngineDoesNotFit, Memory, ModelShape, size_engine
from pipelines.llm.startup import EngineStartError, LogWatch, fatal_answer, relevant_lines
from tuning.space import build_space

LLAMA_3_8B = {  # meta-llama/Meta-Llama-3-8B config.json, the fields that size it
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
LLAMA_8B_WEIGHTS = 16_060_522_496  # 8.03B parameters in bf16
H100 = Memory(int(79.1 * GIB * 0.9), True, "NVML gpu:0 H100: 79.1 GiB free x 0.9")


def llama_8b(max_positions: int = 8192) -> ModelShape:
    config = {**LLAMA_3_8B, "max_position_embeddings": max_positions}
    return shape_from_config(config, 2, LLAMA_8B_WEIGHTS)


def test_a_config_json_gives_the_kv_bytes_per_token() -> None:
    shape = llama_8b()
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (32, 8, 128)
    assert shape.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    gpt2 = shape_from_config(
        {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024}, 4, 0
    )
    assert (gpt2.kv_heads, gpt2.head_dim, gpt2.max_positions) == (12, 64, 1024)


def test_llama_3_8b_on_an_80gb_h100_runs_48_sequences_of_its_whole_context() -> None:
    size = size_engine("vllm", H100, llama_8b(), LlmOptions(engine="vllm"))
    assert (size.sequences, size.context, size.reduced) == (48, 8192, "")
    # 71.2 GiB - 15.0 GiB of weights - 2.1 GiB margin leaves ~54 GiB: 432k tokens of KV.
    assert 53 * GIB < H100.bytes - LLAMA_8B_WEIGHTS - size.margin_bytes < 55 * GIB
    argv = engine_command(_spec("vllm", "gpu:0"), 8000, size)
    assert _flag(argv, "--max-model-len") == "8192" and _flag(argv, "--max-num-seqs") == "48"
    line = size.describe()
    assert "memory 71.2 GiB" in line and "weights 15.0 GiB" in line
    assert "131072 B/token" in line and "48 sequences x 8192 tokens" in line


def test_a_long_context_is_cut_per_sequence_unless_the_user_set_it() -> None:
    shape = llama_8b(max_positions=131072)  # Llama 3.1: 48 x 128k tokens is 768 GiB of KV
    cut = size_engine("vllm", H100, shape, LlmOptions(engine="vllm"))
    assert cut.sequences == 48 and 8192 < cut.context < 131072 and cut.context % 32 == 0
    assert cut.cache_tokens * shape.kv_bytes_per_token <= H100.bytes - LLAMA_8B_WEIGHTS
    assert "context cut to" in cut.reduced

    asked = size_engine("vllm", H100, shape, LlmOptions(engine="vllm", max_model_len=131072))
    assert asked.context == 131072 and asked.sequences == 3
    assert "sequences cut to 3 (from 48)" in asked.reduced


def test_a_model_that_cannot_hold_one_sequence_fails_with_the_numbers() -> None:
    seventy_b = ModelShape(80, 64, 8, 128, 8192, 28672, 128256, 2, 141 * GIB, 8192)
    with pytest.raises(EngineDoesNotFit) as big:  # its weights alone are more than the GPU
        size_engine("vllm", H100, seventy_b, LlmOptions(engine="vllm"))
    assert "one sequence of 2048 tokens" in big.value.reason  # the context was cut first
    assert "after weights 141.0 GiB" in big.value.reason
    tiny = ModelShape(2, 4, 2, 16, 64, 128, 349, 4, 500_000, 4096)
    with pytest.raises(EngineDoesNotFit) as info:
        size_engine("transformers", _cpu(24), tiny, LlmOptions(max_model_len=2**32))
    assert "lower options.max_model_len" in info.value.summary


def test_transformers_on_a_cpu_counts_its_mask_and_takes_a_small_batch() -> None:
    tiny = ModelShape(2, 4, 2, 16, 64, 128, 349, 4, 500_000, 4096)
    size = size_engine("transformers", _cpu(24), tiny, LlmOptions())
    assert (size.sequences, size.context, size.batch_tokens, size.blocks) == (48, 4096, 512, 6144)
    # KV 512 B, its K/V read-back 648 B and a mask column of 512 x 4 B per cached token:
    # about 0.6 GB, where the engine's default batch of 8192 tokens made it 6.9 GB.
    assert size.token_bytes == 512 + 648 + 512 * 4
    assert 0.6e9 < size.engine_bytes < 0.7e9
    argv = engine_command(_spec("transformers", "cpu"), 8000, size)
    assert (
        _flag(argv, "--cb-num-blocks") == "6144" and _flag(argv, "--cb-max-batch-tokens") == "512"
    )

    small = size_engine("transformers", _cpu(1.3), tiny, LlmOptions())  # ~0.2 GiB left
    assert small.context == 2048 and small.sequences == 37  # context cut to 2048, then seqs
    assert small.engine_bytes <= 1.3 * GIB - small.margin_bytes


def test_meminfo_lines_read_as_bytes() -> None:
    text = "MemTotal:       24683656 kB\nMemAvailable:   24241680 kB\nHugePages_Total:  0\n"
    assert meminfo_bytes(text) == {"MemTotal": 24683656 * 1024, "MemAvailable": 24241680 * 1024}
    assert meminfo_bytes("Node 0 MemTotal:  10053408 kB\n") == {"MemTotal": 10053408 * 1024}


def test_the_dead_batching_thread_of_transformers_serve_is_fatal() -> None:
    body = (
        '{"error":"CB worker is dead and cannot accept request 78ff: Memory footprint '
        '6952603648 is more than available memory 4700000000"}'
    )
    assert fatal_answer(503, body) == (
        "CB worker is dead (KV cache and buffers of 7.0 GB > 4.7 GB available)"
    )
    assert fatal_answer(503, '{"error": "model is loading"}') is None
    assert fatal_answer(404, body) is None


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
        "ValueError: No available memory for the cache blocks.",
        "MemoryError: Memory footprint 6952603648 is more than available memory 5892137779",
    ],
)
def test_a_fatal_line_in_the_engine_log_is_seen_once_written(tmp_path: Path, line: str) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old start: CUDA out of memory\n")
    watch = LogWatch(log, log.stat().st_size)  # the earlier start's lines are not this one's
    assert watch.fatal_line() is None
    with log.open("a") as f:
        f.write("INFO loading weights\n" + line[:20])
    assert watch.fatal_line() is None  # half a line: not yet
    with log.open("a") as f:
        f.write(line[20:] + "\nINFO more\n")
    assert watch.fatal_line() is not None
    assert watch.fatal_line() is None


def test_the_reason_keeps_the_error_lines_of_a_traceback(tmp_path: Path) -> None:
    tail = (
        "INFO: started\n"
        "2026-11-23 23:05:54,693 - ContinuousBatchingLogger - ERROR - Error in generation loop: "
        "Memory footprint 6952603648 is more than available memory 5892137779\n"
        "Traceback (most recent call last):\n"
        '  File "cache.py", line 696, in _check_footprint\n    raise MemoryError(\n'
        "MemoryError: Memory footprint 6952603648 is more than available memory 5892137779\n"
        "INFO: 127.0.0.1 - POST /v1/completions 503\n"
    )
    assert relevant_lines(tail) == [
        "MemoryError: KV cache and buffers of 7.0 GB > 5.9 GB available"
    ]
    error = EngineStartError("engine exited with 1", tmp_path / "e.log", tail)
    assert error.summary.splitlines() == [
        "engine exited with 1",
        "MemoryError: KV cache and buffers of 7.0 GB > 5.9 GB available",
        f"engine log: {tmp_path / 'e.log'}",
    ]
    assert str(error).startswith("engine exited with 1; log ")
    dead = EngineStartError(
        "engine failed to start: CB worker is dead (KV cache and buffers of 7.0 GB > 5.9 GB "
        "available)", tmp_path / "e.log", tail,
    )  # fmt: skip
    assert len(dead.summary.splitlines()) == 2  # the log's lines only repeated the reason
    vllm = "(EngineCore_DP0 pid=7) ERROR 11-23 10:44:38 [core.py:700] EngineCore failed to start."
    assert relevant_lines(vllm) == ["EngineCore failed to start."]


def _cpu(gib: float) -> Memory:
    return Memory(int(gib * GIB), False, f"MemAvailable {gib} GiB")


def _spec(engine: str, device: str) -> EngineSpec:
    options = LlmOptions.model_validate({"engine": engine, "engine_bin": "/bin/true"})
    return EngineSpec("llm", "/models/x", device, options, Path("/tmp"))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_is_started_with_the_tool_call_parser_when_one_is_named() -> None:
    plain = engine_command(_spec("vllm", "gpu:0"), 8000)
    assert "--enable-auto-tool-choice" not in plain and "--tool-call-parser" not in plain
    spec = _spec("vllm", "gpu:0")
    named = replace(spec, options=spec.options.model_copy(update={"tool_call_parser": "hermes"}))
    argv = engine_command(named, 8000)
    assert "--enable-auto-tool-choice" in argv and _flag(argv, "--tool-call-parser") == "hermes"


def test_vllm_is_started_with_the_stream_interval_where_it_is_not_its_own_default() -> None:
    """`stream_interval` reaches vLLM as `--stream-interval`; at 1 (vLLM's own default) no
    flag is given, so an older vLLM without it still starts."""
    spec = _spec("vllm", "gpu:0")
    assert "--stream-interval" not in engine_command(spec, 8000)
    four = replace(spec, options=spec.options.model_copy(update={"stream_interval": 4}))
    assert _flag(engine_command(four, 8000), "--stream-interval") == "4"
    assert (
        "options.stream_interval"
        in build_space(
            "llm", PipelineConfig(kind="llm", impl="x:y", options={"engine": "vllm"}), {}, {}
        ).knobs
    )
