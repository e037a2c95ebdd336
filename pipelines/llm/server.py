"""The engine server an LLM worker runs: `vllm serve`, `transformers serve`, or a URL.

The engine does continuous batching itself; the worker starts it as a child process on
its own device (the worker's `CUDA_VISIBLE_DEVICES`) with the pipeline's knobs, waits
until it really answers a generation (an open port is not enough: the model may still
be loading or compiling), and restarts it when it dies. Before the first start it sizes
the engine to the device (`pipelines.llm.sizing`). A start fails at once when the engine
exits or shows a fatal error (`pipelines.llm.startup`), and after `startup_timeout_s`
without an answer, with the reason and the tail of the engine's log. vLLM runs from its
own environment (`engine_bin`), so its torch pin never meets mmq's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from common.procs import die_with_parent, free_port, signal_group
from pipelines.llm.command import EngineSpec, engine_command, engine_size
from pipelines.llm.sizing import EngineSize
from pipelines.llm.startup import (
    EngineStartError,
    LogWatch,
    fatal_answer,
    log_tail,
    relevant_lines,
)

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.5
SLEEP_TIMEOUT_S = 120.0
"""How long a sleep (weights copied to host memory) or a wake may take."""

__all__ = ["EngineServer", "EngineSpec", "EngineStartError", "engine_command"]


class EngineServer:
    """One engine: started, probed, restarted; or a URL that already runs."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = spec.data_dir / "engine-logs" / f"{spec.pipeline}-{os.getpid()}.log"
        self.restarts = 0
        self.port = 0
        self.base_url = spec.options.engine_url or ""
        self.size: EngineSize | None = None
        self._sized = False
        self._log_start = 0
        self.asleep = False
        """Put to sleep (`sleep`): the process runs, its weights in host memory."""

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
        if not self._sized:  # once: a restart keeps the sizes the engine ran with
            self.size, self._sized = engine_size(self.spec), True
        # The same port across restarts, so clients keep their base URL.
        port = self.port = self.port or self.spec.options.port or free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        argv = engine_command(self.spec, port, self.size)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
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
        env = {**os.environ, "VLLM_CACHE_ROOT": cache, "HF_HUB_CACHE": hub_cache}
        if self.spec.sleeps:  # vLLM serves /sleep and /wake_up in its development mode
            env["VLLM_SERVER_DEV_MODE"] = "1"
        if self.spec.options.engine == "vllm" and not self.spec.on_gpu:
            # vLLM's CPU build binds its model worker's threads to cores and keeps one for
            # its server, as if it had the machine to itself; beside mmq's API, workers
            # and Redis on a 2-core host that stalled every process for 30 s at a time
            # (leases lost). A core list of the user's own (this variable) is kept.
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return env

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
        """Poll until a one-token generation succeeds; fail at once when the engine exits
        or shows a fatal error, or when `startup_timeout_s` is up."""
        timeout_s = self.spec.options.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        watch = LogWatch(self.log_path, self._log_start) if self.managed else None
        last_error = "no answer yet"
        with httpx.Client(timeout=30.0) as http:
            while time.monotonic() < deadline:
                self._raise_if_fatal(watch)
                try:
                    r = http.post(f"{self.base_url}/v1/completions", json=self.probe_body())
                except httpx.HTTPError as exc:
                    last_error = f"{type(exc).__name__}: {exc}"
                else:
                    if r.status_code == 200:
                        log.info("engine %s: ready at %s", self.spec.pipeline, self.base_url)
                        return
                    fatal = fatal_answer(r.status_code, r.text)
                    if fatal is not None:
                        raise self._failed(f"engine failed to start: {fatal}")
                    last_error = f"HTTP {r.status_code}: {r.text[:300]}"
                time.sleep(PROBE_INTERVAL_S)
        raise self._failed(
            f"engine did not answer a generation within {timeout_s:.0f}s ({last_error})"
        )

    def _raise_if_fatal(self, watch: LogWatch | None) -> None:
        if not self.alive():
            code = self.process.returncode if self.process else None
            last = relevant_lines(log_tail(self.log_path, self._log_start))[-1:]
            raise self._failed(": ".join([f"engine exited with {code}", *last]))
        line = watch.fatal_line() if watch is not None else None
        if line is not None:
            raise self._failed(f"engine failed to start: {line}")

    def probe_body(self) -> dict[str, object]:
        return {"model": self.spec.served_name, "prompt": "Hi", "max_tokens": 1}

    def _failed(self, reason: str) -> EngineStartError:
        if not self.managed:
            return EngineStartError(reason)
        return EngineStartError(reason, self.log_path, log_tail(self.log_path, self._log_start))

    def sleep(self) -> bool:
        """Put the engine to sleep (vLLM's sleep mode, level 1: the weights to host memory,
        the KV cache dropped); False where it did not (the engine stays as it was)."""
        try:
            r = httpx.post(f"{self.base_url}/sleep", params={"level": 1}, timeout=SLEEP_TIMEOUT_S)
        except httpx.HTTPError as exc:
            log.warning("engine %s did not sleep: %s", self.spec.pipeline, exc)
            return False
        if r.status_code != 200:
            log.warning("engine %s did not sleep: HTTP %d %s", self.spec.pipeline, r.status_code,
                        r.text[:300])  # fmt: skip
            return False
        self.asleep = True
        log.info("engine %s: asleep", self.spec.pipeline)
        return True

    def wake(self) -> None:
        """Wake a sleeping engine and return once it answers a generation again."""
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            r = httpx.post(f"{self.base_url}/wake_up", timeout=SLEEP_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise self._failed(f"the engine did not wake: {exc}") from exc
        if r.status_code != 200:
            raise self._failed(f"the engine did not wake: HTTP {r.status_code} {r.text[:300]}")
        self.asleep = False
        self.wait_ready()
        log.info("engine %s: awake", self.spec.pipeline)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the engine and every process it started. vLLM's engine core and model
        workers outlive a server process that was killed (SIGKILL, out of memory) and hold
        their memory; they are in its process group (its own session), which goes whole."""
        process, self.process = self.process, None
        self.asleep = False
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        signal_group(process, signal.SIGKILL)
