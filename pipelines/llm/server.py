"""The engine server an LLM worker runs: `vllm serve`, `transformers serve`, or a URL.

The engine does continuous batching itself; the worker starts it as a child process on
its own device (the worker's `CUDA_VISIBLE_DEVICES`) with the pipeline's knobs, waits
until it really answers a generation (an open port is not enough: the model may still
be loading or compiling), and restarts it when it dies. A start that does not finish in
`startup_timeout_s` fails with the tail of the engine's log. vLLM runs from its own
environment (`engine_bin`), so its torch pin never meets mmq's.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.procs import die_with_parent, free_port
from jobs.schemas.llm import LlmOptions

log = logging.getLogger(__name__)

LOG_TAIL_BYTES = 4000
TRANSFORMERS_MODEL_LEN = 4096
"""`transformers serve`: context length the KV cache is sized for without max_model_len."""
KV_BLOCK_TOKENS = 32


class EngineStartError(RuntimeError):
    """The engine did not come up; the message holds the tail of its log."""


@dataclass(frozen=True)
class EngineSpec:
    """What to start: a model, on a device, with the pipeline's options."""

    pipeline: str
    model: str
    device: str
    options: LlmOptions
    data_dir: Path

    @property
    def served_name(self) -> str:
        return self.options.served_model_name or self.model

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith(("gpu", "mig", "cuda"))


def engine_command(spec: EngineSpec, port: int) -> list[str]:
    """The engine server's argv for `spec`, listening on 127.0.0.1:`port`."""
    opts = spec.options
    if opts.engine == "vllm":
        argv = [_executable(opts, "vllm"), "serve", spec.model, "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--served-model-name", spec.served_name]
        argv += ["--max-num-seqs", str(opts.max_num_seqs or opts.max_inflight)]
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
        argv += ["--dtype", opts.dtype]
        argv.append(
            "--enable-prefix-caching" if opts.prefix_caching else "--no-enable-prefix-caching"
        )
        if opts.max_model_len:
            argv += ["--max-model-len", str(opts.max_model_len)]
        if opts.max_num_batched_tokens:
            argv += ["--max-num-batched-tokens", str(opts.max_num_batched_tokens)]
        if opts.quantization:
            argv += ["--quantization", opts.quantization]
        return argv + opts.extra_args
    if opts.engine == "transformers":
        device = "cuda:0" if spec.on_gpu else "cpu"
        argv = [_executable(opts, "transformers"), "serve", spec.model, "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--device", device, "--dtype", opts.dtype]
        argv += ["--continuous-batching", "--log-level", "info"]
        if not spec.on_gpu:
            argv.append("--no-cb-use-cuda-graph")
        # KV cache for max_inflight sequences of max_model_len tokens; unbounded, it
        # takes a share of the whole memory (of RAM, on a CPU).
        seqs = opts.max_num_seqs or opts.max_inflight
        blocks = -(-seqs * (opts.max_model_len or TRANSFORMERS_MODEL_LEN) // KV_BLOCK_TOKENS)
        argv += ["--cb-block-size", str(KV_BLOCK_TOKENS), "--cb-num-blocks", str(blocks)]
        if opts.max_num_batched_tokens:
            argv += ["--cb-max-batch-tokens", str(opts.max_num_batched_tokens)]
        if opts.quantization:
            argv += ["--quantization", opts.quantization]
        return argv + opts.extra_args
    raise ValueError(f"engine {opts.engine!r} is not started by mmq")


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


class EngineServer:
    """One engine: started, probed, restarted; or a URL that already runs."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = spec.data_dir / "engine-logs" / f"{spec.pipeline}-{os.getpid()}.log"
        self.restarts = 0
        self.port = 0
        self.base_url = spec.options.engine_url or ""

    @property
    def managed(self) -> bool:
        """True when mmq runs the engine process (not an external URL)."""
        return self.spec.options.engine != "url"

    def start(self) -> None:
        """Start the engine and return once it answers a generation."""
        if not self.managed:
            if not self.base_url:
                raise EngineStartError("engine = 'url' needs options.engine_url")
            self.wait_ready()
            return
        # The same port across restarts, so clients keep their base URL.
        port = self.port = self.port or self.spec.options.port or free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        argv = engine_command(self.spec, port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("engine %s: starting %s", self.spec.pipeline, " ".join(argv))
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                argv,
                env=self._env(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        try:
            self.wait_ready()
        except EngineStartError:
            self.stop()
            raise

    def _env(self) -> dict[str, str]:
        cache = self.spec.options.cache_root or str(
            self.spec.data_dir / "engine-cache" / self.spec.pipeline
        )
        hub_cache = os.environ.get("HF_HUB_CACHE") or str(self.spec.data_dir / "hf-hub")
        Path(cache).mkdir(parents=True, exist_ok=True)
        Path(hub_cache).mkdir(parents=True, exist_ok=True)
        return {**os.environ, "VLLM_CACHE_ROOT": cache, "HF_HUB_CACHE": hub_cache}

    def alive(self) -> bool:
        """False once a managed engine process has exited."""
        return not self.managed or (self.process is not None and self.process.poll() is None)

    def exited(self, within_s: float) -> bool:
        """True when the managed engine process is gone or exits within `within_s`: a
        stream broke because the engine died, not because one request was dropped."""
        if not self.managed:
            return False  # nothing to watch: the next request finds out
        process = self.process
        if process is None:
            return True  # stopped, or between the two halves of a restart
        try:
            process.wait(within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait_ready(self) -> None:
        """Poll until a one-token generation succeeds, the process dies, or time is up."""
        deadline = time.monotonic() + self.spec.options.startup_timeout_s
        last_error = "no answer yet"
        with httpx.Client(timeout=30.0) as http:
            while time.monotonic() < deadline:
                if not self.alive():
                    code = self.process.returncode if self.process else None
                    raise EngineStartError(f"the engine exited with {code}{self._tail()}")
                try:
                    r = http.post(f"{self.base_url}/v1/completions", json=self.probe_body())
                    if r.status_code == 200:
                        log.info("engine %s: ready at %s", self.spec.pipeline, self.base_url)
                        return
                    last_error = f"HTTP {r.status_code}: {r.text[:300]}"
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                time.sleep(0.5)
        raise EngineStartError(
            f"the engine did not answer a generation within "
            f"{self.spec.options.startup_timeout_s:.0f}s ({last_error}){self._tail()}"
        )

    def probe_body(self) -> dict[str, object]:
        return {"model": self.spec.served_name, "prompt": "Hi", "max_tokens": 1}

    def _tail(self) -> str:
        if not self.managed or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
        return f"; log {self.log_path} ends with:\n{tail}"

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
