"""A pipeline that does nothing: measures the service's own overhead (bench/overhead.py)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pydantic import Field

from jobs.schemas.base import JobInput
from pipelines.base import Request, SimplePipeline


class NoopInput(JobInput):
    payload: str = Field(default="", max_length=10_000)
    """Echoed back as the output."""


class NoopPipeline(SimplePipeline[NoopInput]):
    kind = "noop"

    def load(self) -> None:
        pass

    def batch_key(self, request: NoopInput) -> Hashable | None:
        return "noop"

    def run(self, batch: Sequence[Request[NoopInput]]) -> None:
        for request in batch:
            request.succeed({"payload": request.input.payload})
