"""LLM (chat or completion) job input, and the options of an LLM pipeline."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobs.errors import InputError
from jobs.schemas.base import CachePolicy, JobInput, over_limit
from jobs.settings import Limits, PipelineConfig, Settings
from jobs.tokens import count_tokens


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)


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
    served_model_name: str | None = None
    """The model name the engine answers to; default: the pipeline's `model`."""
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


class LlmInput(JobInput):
    messages: list[ChatMessage] | None = Field(default=None, max_length=1000)
    """Chat messages; exactly one of `messages` and `prompt`."""
    prompt: str | None = Field(default=None, max_length=1_000_000)
    """Plain completion prompt."""
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: list[str] | None = Field(default=None, max_length=4)
    seed: int | None = None
    cache: bool = True
    """Answer a deterministic request (temperature 0) from the response cache."""

    @model_validator(mode="after")
    def _one_prompt(self) -> LlmInput:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")
        return self

    def texts(self) -> list[str]:
        if self.messages is not None:
            return [m.content for m in self.messages]
        return [self.prompt or ""]

    def prompt_chars(self) -> int:
        return sum(len(text) for text in self.texts())

    def cost(self) -> int:
        """Tokens: the prompt's, estimated from its characters, and `max_tokens`, as
        OpenAI's rate limiter counts a request when it is admitted."""
        return count_tokens(self.texts(), None) + self.max_tokens

    def check_limits(self, limits: Limits) -> None:
        if self.max_tokens > limits.llm_max_tokens:
            raise over_limit("max_tokens", self.max_tokens, limits.llm_max_tokens)
        chars = self.prompt_chars()
        if chars > limits.llm_max_prompt_chars:
            field = "messages" if self.messages is not None else "prompt"
            raise InputError(
                field, f"{chars} characters is over the limit of {limits.llm_max_prompt_chars}"
            )

    def prompt_tokens(self, config: PipelineConfig) -> int:
        """The prompt's length in tokens, as estimated before it runs."""
        options = config.options_as(LlmOptions)
        return count_tokens(self.texts(), options.tokenizer or config.model or None)

    def route(self, pipeline: str, settings: Settings) -> str:
        """Prompts over `long_prompt_threshold` tokens go to `long_pipeline`, so that
        short prompts never wait behind them."""
        config = settings.pipelines[pipeline]
        options = config.options_as(LlmOptions)
        long = options.long_pipeline
        if long is None or long not in settings.enabled_pipelines or long == pipeline:
            return pipeline
        if self.prompt_tokens(config) > options.long_prompt_threshold:
            return long
        return pipeline

    def cache_policy(self, config: PipelineConfig) -> CachePolicy | None:
        """Deterministic requests (temperature 0, cache on) are cached per model and
        parameters; everything but `cache` and the model's alias decides the answer."""
        ttl = config.options_as(LlmOptions).cache_ttl_s
        if not self.cache or self.temperature != 0 or ttl <= 0:
            return None
        decided = self.model_dump(mode="json", exclude={"cache", "model", "seed"})
        decided["model"] = config.model
        canonical = json.dumps(decided, sort_keys=True, separators=(",", ":"))
        return CachePolicy(hashlib.sha256(canonical.encode()).hexdigest(), ttl)
