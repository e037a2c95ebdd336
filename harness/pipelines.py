"""Test-only pipelines: an echo that batches by group, a sleep that checks for cancel,
and failures on request (a raise, or the worker process dying)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Hashable, Sequence

from pydantic import Field

from jobs.errors import InputError
from jobs.filerefs import FileRef
from jobs.schemas.base import JobInput
from pipelines.base import Request, SimplePipeline


class EchoInput(JobInput):
    text: str = Field(max_length=1000)
    group: str = "a"
    """Requests of the same group may share a batch."""
    sleep_ms: int = Field(default=0, ge=0, le=60_000)
    """Time the batch takes."""
    fail: bool = False
    """Raise inside the pipeline: the whole batch fails."""
    reject: bool = False
    """Fail this request alone as bad input (InputError)."""
    crash: bool = False
    """Kill the worker process in the middle of the batch."""
    tpot_ms: float | None = Field(default=None, ge=0, le=60_000)
    """Report this time per output token (as an LLM pipeline does) in the job's timings."""
    attachment: FileRef | None = None
    """A file (checked by the API at submit as any file input is; echo does not read it)."""


class EchoPipeline(SimplePipeline[EchoInput]):
    kind = "echo"

    def load(self) -> None:
        pass

    def batch_key(self, request: EchoInput) -> Hashable | None:
        return request.group

    def run(self, batch: Sequence[Request[EchoInput]]) -> None:
        inputs = [r.input for r in batch]
        batch_id = uuid.uuid4().hex
        longest = max(i.sleep_ms for i in inputs)
        if any(i.crash for i in inputs):
            time.sleep(longest / 2000)
            os._exit(17)
        if any(i.fail for i in inputs):
            raise RuntimeError("boom: the echo pipeline was asked to fail")
        time.sleep(longest / 1000)
        for request in batch:
            if request.input.reject:
                request.fail(InputError("text", "rejected by the pipeline"))
                continue
            request.partial({"text": request.input.text[:1]})
            if request.input.tpot_ms is not None:
                request.record_timing("tpot_ms", request.input.tpot_ms)
            request.succeed(
                {
                    "text": request.input.text,
                    "batch_id": batch_id,
                    "batch_size": len(batch),
                    "pid": os.getpid(),
                }
            )


class SleepInput(JobInput):
    steps: int = Field(default=10, ge=1, le=1000)
    step_ms: int = Field(default=50, ge=0, le=10_000)


class SleepPipeline(SimplePipeline[SleepInput]):
    """Sleeps step by step, one request at a time, and stops at the next step on cancel."""

    kind = "sleep"

    def load(self) -> None:
        pass

    def run(self, batch: Sequence[Request[SleepInput]]) -> None:
        (request,) = batch
        total = request.input.steps
        for step in range(1, total + 1):
            if request.drop_if_canceled():
                return
            time.sleep(request.input.step_ms / 1000)
            request.progress(step, total)
        request.succeed({"steps": total, "pid": os.getpid()})


class BatchCostInput(JobInput):
    text: str = Field(default="x", max_length=100)


class BatchCostPipeline(SimplePipeline[BatchCostInput]):
    """A model whose batch time is known: `BASE_MS` for up to `KNEE` requests, `EXTRA_MS`
    more for each one beyond. Batching pays up to `KNEE` and hurts past it, so under a
    closed loop of 4 and 8 clients, with batches that wait to fill, `max_batch = KNEE`
    serves the most requests within a few hundred ms (the answer `mmq tune` must find).
    `options.fail_load` makes its start fail (a candidate that cannot run)."""

    kind = "batchcost"
    BASE_MS = 100
    KNEE = 4
    EXTRA_MS = 100

    def load(self) -> None:
        if self.config.options.get("fail_load"):
            raise RuntimeError("asked to fail by options.fail_load")

    def batch_key(self, request: BatchCostInput) -> Hashable | None:
        return "all"

    def run(self, batch: Sequence[Request[BatchCostInput]]) -> None:
        extra = max(0, len(batch) - self.KNEE) * self.EXTRA_MS
        time.sleep((self.BASE_MS + extra) / 1000)
        for request in batch:
            request.succeed({"batch_size": len(batch)})
