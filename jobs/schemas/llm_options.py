"""The options of an LLM pipeline (`[pipelines.NAME.options]`), and what its engine and
its model honour beyond plain text generation."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.settings import PipelineConfig

Feature = Literal[
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "n",
    "presence_penalty",
    "images",
    "stop",
]
"""What an engine may honour beyond plain text generation. A request that needs one its
pipeline's engine lacks is refused by name (422) at submit, never sent to an engine that
would drop it without a word."""

ENGINE_FEATURES: dict[str, frozenset[Feature]] = {
    "vllm": frozenset(get_args(Feature)),
    # `transformers serve` (5.23) renders `tools` into the chat template and parses the
    # model's calls back (Qwen, Gemma 4, or the tokenizer's own response template). It
    # drops `tool_choice`, `parallel_tool_calls`, `response_format`, `logprobs`, `n` and
    # `presence_penalty` with a log line (`UNUSED_CHAT_COMPLETION_FIELDS`). It reads image
    # parts for a vision-language model, and drops them for another (so does mmq's check:
    # `takes_images`).
    # It maps `stop` to `stop_strings`, which its continuous batching does not apply: an
    # answer runs through the stop string to max_tokens.
    "transformers": frozenset({"tools", "images"}),
    "url": frozenset({"stop"}),
}
"""What each engine honours, in one place: `LlmOptions.engine_features` overrides it (an
engine at a URL declares what it is)."""

FEATURE_NAMES: dict[Feature, str] = {
    "tools": "tool calling",
    "tool_choice": "tool_choice other than auto, or parallel_tool_calls false",
    "response_format": "structured output",
    "logprobs": "log probabilities",
    "n": "several choices (n > 1)",
    "presence_penalty": "presence_penalty",
    "images": "image parts",
    "stop": "stop sequences",
}


class LlmOptions(BaseModel):
    """`options` of an LLM pipeline (`[pipelines.NAME.options]`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["transformers", "vllm", "url"] = "transformers"
    """The engine server: `vllm` (`vllm serve`, GPUs), `transformers` (`transformers
    serve`, CPU and tests), or `url`: one that already runs at `engine_url`."""
    engine_url: str | None = None
    """Base URL of a running OpenAI-compatible engine (`engine = "url"`)."""
    engine_bin: str | None = None
    """The engine's executable, e.g. `/opt/vllm/bin/vllm` from vLLM's own environment;
    default: `vllm` / `transformers` beside this Python, else on PATH."""
    engine_features: list[Feature] | None = None
    """What the engine honours beyond plain text (`tools`, `tool_choice`,
    `response_format`, `logprobs`, `n`, `presence_penalty`, `images`, `stop`); a request
    that needs another is refused with a 422 naming the field. Default: the engine's own
    (`ENGINE_FEATURES`: vLLM all of them, `transformers serve` tools and images); an engine
    at a URL declares its own (default: `stop`).
    """
    takes_tools: bool | None = None
    """Whether the model sees `tools`; unset: its chat template renders them (read where
    `model` is a local directory; a hub model is taken at its word)."""
    takes_images: bool | None = None
    """Whether the model reads image parts (a vision-language model); unset: read from
    its config.json where `model` is a local directory (a `vision_config`), else no."""
    tool_call_parser: str | None = None
    """vLLM: the parser of the model's tool calls (`hermes` for Qwen, `llama3_json`,
    `mistral`, …: vLLM's `--tool-call-parser`, with `--enable-auto-tool-choice`). Without
    it vLLM takes only a named or `required` `tool_choice`, and answers `auto` with an
    error that the client gets as a 422."""
    served_model_name: str | None = None
    """The model name the engine answers to; default: the pipeline's `model`."""
    lora_modules: dict[str, str] = Field(default_factory=dict)
    """LoRA adapters served beside the model, name -> directory (PEFT's
    `adapter_config.json` and weights): vLLM's `--lora-modules NAME=PATH`, with
    `--enable-lora`. A request names an adapter as its `model` (vLLM's convention) and is
    answered by it; `GET /v1/models` lists each with the pipeline's model as its `parent`.
    vLLM only (an engine at a URL: the names it serves)."""
    max_lora_rank: int = Field(default=16, ge=1, le=512)
    """The largest rank of the adapters (vLLM's `--max-lora-rank`)."""
    max_loras: int | None = Field(default=None, ge=1)
    """Adapters in one engine step (vLLM's `--max-loras`); default: vLLM's own."""
    max_inflight: int = Field(default=48, ge=1, le=4096)
    """Sequences the worker feeds the engine at once (its admission limit); the rest wait
    in the queue (priorities, 429). The engine is sized for this many (see
    `max_model_len`)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context (prompt + output tokens) per sequence. Unset: the model's
    `max_position_embeddings`, cut (down to 2048) until `max_inflight` sequences of it fit
    the memory the engine may have (the worker logs the numbers). Set: kept, and the
    engine runs fewer sequences at once instead (the rest wait inside it). When not even
    one sequence fits, the worker fails at once with the reason (`/readyz` shows it)."""
    max_num_seqs: int | None = Field(default=None, ge=1)
    """Sequences the engine's KV cache is sized for (vLLM's `--max-num-seqs`); default:
    `max_inflight`, cut to what fits."""
    max_num_batched_tokens: int | None = Field(default=None, ge=16)
    """Tokens per engine step (vLLM `--max-num-batched-tokens`, transformers
    `--cb-max-batch-tokens`). Default: vLLM's own; for `transformers serve` 512 on a CPU
    and 2048 on a GPU, because its attention mask takes this x the cache's tokens."""
    stream_interval: int = Field(default=1, ge=1, le=64)
    """vLLM: tokens it gathers per streamed chunk of a sequence (`--stream-interval`; the
    first token always goes at once). Much of what mmq's relay, Redis and API spend goes
    per chunk, whatever its tokens: at 4, mmq spent 0.56x the CPU per token of 1 in front
    of a synthetic engine (`bench.llm_ceiling --stream-interval 4`), and a stream's tokens
    arrive 4 engine steps apart. `mmq tune` tries 1 and 4."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    """Share of the GPU the engine takes (vLLM's flag); mmq sizes against the device's
    free memory x this."""
    quantization: str | None = None
    dtype: str = "auto"
    prefix_caching: bool = True
    cache_root: str | None = None
    """`VLLM_CACHE_ROOT` (torch.compile and CUDA-graph caches); default:
    `data_dir/engine-cache/PIPELINE`, kept across restarts."""
    extra_args: list[str] = Field(default_factory=list)
    """More command-line arguments for the engine server."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port of the engine server on 127.0.0.1; 0: a free one."""
    startup_timeout_s: float = Field(default=900.0, gt=0)
    """How long the engine may take to answer its first generation. An engine that exits,
    answers with a fatal error or logs one (out of memory, a CUDA error, a dead engine
    core) ends the wait at once."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Longest silence on a request's token stream before it counts as lost."""
    long_prompt_threshold: int = Field(default=5000, ge=1)
    """Prompts over this many tokens go to `long_pipeline`."""
    long_pipeline: str | None = None
    """The pipeline (its own engine and queue) that serves long prompts."""
    tokenizer: str | None = None
    """tokenizer.json (or a directory with one) the API counts prompt tokens with;
    default: the model directory's, else characters / 4."""
    cache_ttl_s: float = Field(default=3600.0, ge=0)
    """How long a deterministic answer (temperature 0) is reused; 0: no response cache."""
    sleep_mode: bool | None = None
    """vLLM with `residency = "on_demand"`: an unload puts the engine to sleep (vLLM's
    sleep mode, level 1: the weights to host memory, the KV cache dropped, the GPU's memory
    given back) instead of stopping it, and the next load wakes it, in seconds rather
    than a whole start. The engine runs with `--enable-sleep-mode` and
    `VLLM_SERVER_DEV_MODE=1` (which also serves vLLM's other development routes on its
    loopback port). Unset: on for vLLM on a GPU when on demand."""

    @model_validator(mode="after")
    def _vllm_only(self) -> LlmOptions:
        if self.sleep_mode and self.engine != "vllm":
            raise ValueError("sleep_mode is vLLM's: it needs engine = 'vllm'")
        if self.lora_modules and self.engine == "transformers":
            raise ValueError(
                "lora_modules needs engine = 'vllm' (or 'url', an engine that serves them): "
                "transformers serve takes no adapters"
            )
        return self


def engine_features(options: LlmOptions) -> frozenset[Feature]:
    """What the pipeline's engine honours: its declaration, else its engine's own."""
    if options.engine_features is not None:
        return frozenset(options.engine_features)
    return ENGINE_FEATURES[options.engine]


def takes_images(config: PipelineConfig) -> bool:
    """Whether the pipeline's model reads images: its `takes_images` option, else its
    config.json (a local model directory with a `vision_config`)."""
    options = config.options_as(LlmOptions)
    if options.takes_images is not None:
        return options.takes_images
    return _has_vision_config(config.model or "")


def renders_tools(config: PipelineConfig) -> bool:
    """Whether the pipeline's model sees the tools it is given: its `takes_tools` option,
    else whether its chat template (in a local model directory) renders `tools`. A model
    that is not a local directory is taken at its word: its engine renders its template."""
    options = config.options_as(LlmOptions)
    if options.takes_tools is not None:
        return options.takes_tools
    template = _chat_template(config.model or "")
    return template is None or "tools" in template


@functools.cache
def _chat_template(model: str) -> str | None:
    """The chat template of a local model directory; None where there is none to read."""
    folder = Path(model)
    try:
        return (folder / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: [{"name": …, "template": …}]
        return "".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None


@functools.cache
def _has_vision_config(model: str) -> bool:
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "vision_config" in config
