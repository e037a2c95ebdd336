"""A pipeline that does nothing: measures the service's own overhead (bench/overhead.py)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pydantic import Field

from jobs.schemas.base import JobInput
from pipelines.base import Pipeline, Request


class NoopInput(JobInput):
    payload: str = Field(default="", max_length=10_000)
    """Echoed back as the output."""


class NoopPipeline(Pipeline):
    kind = "noop"
    input_model = NoopInput

    def load(self) -> None:
        pass

    def batch_key(self, request: JobInput) -> Hashable | None:
        return "noop"

    def run(self, batch: Sequence[Request]) -> None:
        for request in batch:
            assert isinstance(request.input, NoopInput)
            request.succeed({"payload": request.input.payload})
