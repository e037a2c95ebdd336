"""LLM jobs on a continuous-batching engine server.

The engine batches sequences itself, so each job is its own request (no batch key) and
the worker feeds the engine `max_inflight` of them at once: the pipeline's `knobs` set
its worker's concurrency and runners to that number, and a semaphore holds the line, so the
rest wait in the Redis queue (priorities, 429) instead of in a hidden backlog inside the
engine. Tokens stream back as `partial` events; the job records TTFT, TPOT, mean ITL
and E2E as the worker sees them. When the engine process dies, a monitor restarts it
and the jobs it was running go back to the queue through their leases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import BinaryIO

from jobs.outputs import LlmOutput, LlmUsage, PartialData
from jobs.schemas.llm import LlmInput
from jobs.schemas.llm_options import LlmOptions
from jobs.settings import PipelineConfig, Settings, on_gpu
from pipelines.base import BackendLost, EngineKnobs, Request, SimplePipeline
from pipelines.llm.choices import is_delta, merge_partials
from pipelines.llm.engine_client import EngineClient, EngineLost, request_body
from pipelines.llm.gauges import engine_readings, read_metrics
from pipelines.llm.generation import Generation
from pipelines.llm.images import inline_images
from pipelines.llm.packaged import prepare_if_packaged
from pipelines.llm.server import EngineServer, EngineSpec, EngineStartError
from pipelines.llm.sizing import GIB
from telemetry import tracing

log = logging.getLogger(__name__)

MONITOR_INTERVAL_S = 0.5
MAX_RESTART_BACKOFF_S = 30.0
READINGS_TIMEOUT_S = 2.0
"""How long a read of the engine's `/metrics` may take."""
ENGINE_EXIT_GRACE_S = 2.0
"""How long a broken stream waits to see whether the engine process exited."""


class LlmPipeline(SimplePipeline[LlmInput]):
    kind = "llm"

    def __init__(self, config: PipelineConfig, settings: Settings) -> None:
        super().__init__(config, settings)
        self.options = config.options_as(LlmOptions)
        self.server: EngineServer | None = None
        self.client: EngineClient | None = None
        self._slots = threading.BoundedSemaphore(self.options.max_inflight)
        self._ready = threading.Event()
        self._ready_lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="engine-monitor", daemon=True)
        self._no_engine_metrics = False

    @property
    def spec(self) -> EngineSpec:
        config = self.config
        cap = int(config.memory_gb * GIB) if config.memory_gb else None
        return EngineSpec(
            self.name,
            config.model,
            config.device,
            self.options,
            self.settings.data_dir,
            cap,
            sleeps=self.sleeps,
        )

    @property
    def sleeps(self) -> bool:
        """Whether an unload on demand puts the engine to sleep (`park`), not stops it."""
        if self.options.sleep_mode is not None:
            return self.options.sleep_mode
        gpu = on_gpu(self.config.device)
        return self.options.engine == "vllm" and gpu and self.config.residency == "on_demand"

    def load(self) -> None:
        server = self.server
        if server is not None and server.asleep and server.alive():
            try:
                server.wake()
            except EngineStartError as exc:
                log.warning("engine %s did not wake (%s); starting it again", self.name, exc)
            else:
                self._watch_engine()
                self._ready.set()
                return
        if server is not None:  # one that died asleep, or did not wake
            self.unload()
        prepare_if_packaged(self.config.model)  # converted once (`make install` does it)
        self.server = EngineServer(self.spec)
        self.server.start()
        self.client = EngineClient(
            self.server.base_url, self.options.request_timeout_s, self.options.max_inflight + 2
        )
        self._ready.set()
        self._watch_engine()

    def park(self) -> bool:
        """vLLM's sleep mode (`sleeps`): the engine sleeps, its process and the worker's
        connections stay, and the next `load` wakes it. False (nothing done) where it does
        not sleep: the worker unloads."""
        if not self.sleeps or self.server is None or not self.server.alive():
            return False
        self._ready.clear()
        self._unwatch_engine()
        if self.server.sleep():
            return True
        self._ready.set()
        self._watch_engine()
        return False

    def readings(self) -> dict[str, float]:
        """The engine's own gauges from its `/metrics` (`pipelines.llm.gauges`); nothing
        while it is down or asleep, or where it serves no `/metrics` (`transformers serve`:
        asked once)."""
        server = self.server
        if server is None or not self._ready.is_set() or self._no_engine_metrics:
            return {}
        try:
            status, text = read_metrics(server.base_url, READINGS_TIMEOUT_S)
        except OSError:
            return {}
        if status == 404:
            self._no_engine_metrics = True
        return engine_readings(text) if status == 200 else {}

    def _watch_engine(self) -> None:
        """Restart the engine whenever it dies, from now until `_unwatch_engine`."""
        if self.server is None or not self.server.managed:
            return
        self._stop.clear()
        self._monitor = threading.Thread(target=self._watch, name="engine-monitor", daemon=True)
        self._monitor.start()

    def _unwatch_engine(self) -> None:
        self._stop.set()
        if self._monitor.is_alive():
            self._monitor.join(MONITOR_INTERVAL_S * 4)

    def merge_partials(self, first: PartialData, then: PartialData) -> PartialData | None:
        """Tokens of a choice that waited for a write go out as one delta (the first one's
        index)."""
        if is_delta(first) and is_delta(then):
            return merge_partials(first, then)
        return None

    def unload(self) -> None:
        self._ready.clear()
        self._unwatch_engine()
        if self.server is not None:
            self.server.stop()
        if self.client is not None:
            self.client.close()
        self.server = self.client = None

    def knobs(self) -> EngineKnobs:
        """One request per engine call, `max_inflight` calls at once, each on its task's
        thread: the engine batches."""
        slots = self.options.max_inflight
        return EngineKnobs(max_batch=1, max_wait_ms=0.0, runners=1, concurrency=slots, inline=True)

    def run(self, batch: Sequence[Request[LlmInput]]) -> None:
        for request in batch:
            self._generate(request)

    def _generate(self, request: Request[LlmInput]) -> None:
        inp = request.input
        if not self._ready.wait(self.options.startup_timeout_s):
            raise BackendLost("the engine is not back up")
        assert self.client is not None and self.server is not None
        served = inp.model if inp.model in self.options.lora_modules else None
        model = served or self.server.spec.served_name  # an adapter is asked for by name
        path, body = request_body(inp.record(), model)
        if inp.messages is not None:  # image parts named by file key or URL go inline
            limit = self.settings.limits.llm_max_image_bytes

            def open_input(ref: str, field: str) -> BinaryIO:  # the files, where there are any
                return request.files.open_input(ref, field)

            body["messages"] = inline_images(body["messages"], open_input, limit)
        with self._slots:
            restarts = self.server.restarts
            generation = Generation(request)
            try:
                with tracing.span("mmq.engine", attributes={"gen_ai.request.model": model}):
                    traceparent = tracing.current_traceparent()
                    finish = self.client.stream(path, body, generation, traceparent)
            except EngineLost as exc:
                self._engine_lost(restarts)
                raise BackendLost(str(exc)) from exc
        if finish is None:  # canceled: closing the stream aborted the sequence
            return
        choices, clock = generation.choices, generation.clock
        completion = finish.usage.get("completion_tokens", choices.deltas)
        usage: LlmUsage = {
            "prompt_tokens": finish.usage.get("prompt_tokens", 0),
            "completion_tokens": completion,
            "total_tokens": finish.usage.get("prompt_tokens", 0) + completion,
        }
        for name, ms in clock.timings(completion).items():
            request.record_timing(name, ms)
        result: LlmOutput = {
            **choices.output(finish),
            "usage": usage,
            "model": model,
            "cached": False,
        }
        request.succeed(result)

    def _engine_lost(self, restarts_seen: int) -> None:
        """After a broken stream: if the engine died, hold every request until the monitor
        has restarted it, so the job given back is not taken again by a dead engine."""
        assert self.server is not None
        if self.server.exited(ENGINE_EXIT_GRACE_S):
            with self._ready_lock:
                if self.server.restarts == restarts_seen:  # the monitor has not restarted it
                    self._ready.clear()

    def _watch(self) -> None:
        """Restart the engine when its process dies; requests wait while it comes up."""
        backoff = 1.0
        server = self.server
        assert server is not None
        while not self._stop.wait(MONITOR_INTERVAL_S):
            if server.alive():
                continue
            self._ready.clear()
            log.error("engine %s died; restarting it", self.spec.pipeline)
            try:
                server.restart()
            except Exception:
                log.exception(
                    "engine %s did not restart; retrying in %.0fs", self.spec.pipeline, backoff
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_RESTART_BACKOFF_S)
                continue
            backoff = 1.0
            with self._ready_lock:
                self._ready.set()
