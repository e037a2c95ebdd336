"""The protocol between the worker engine and a pipeline.

The engine owns batching, cancel, events and timings; a pipeline only says how to load
its model, which requests may share a batch (`batch_key`), and how to run a batch.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Protocol

from jobs.schemas.base import JobInput
from jobs.settings import PipelineConfig, Settings


class Canceled(Exception):
    """Raised by a pipeline that stopped because every request of its batch was canceled."""


class BackendLost(Exception):
    """Raised by a pipeline whose backend went away mid-batch (an engine server died):
    not the requests' fault, so each one goes back to the queue through its lease and
    runs again (counting an attempt), instead of failing."""


class Files(Protocol):
    """A job's files: its inputs by reference, its outputs by name (in storage)."""

    def input_path(self, ref: str, field: str) -> contextlib.AbstractContextManager[Path]:
        """A local path of the file that input field `field` references, inside a `with`."""
        ...

    def open_input(self, ref: str, field: str) -> BinaryIO:
        """A stream of the file that input field `field` references. Close it."""
        ...

    def put_output(self, name: str, data: Any, content_type: str) -> dict[str, Any]:
        """Store output `name` (bytes or a binary stream); returns its key, signed url,
        bytes, content_type and sha256 for the job's output."""
        ...


class Request(Protocol):
    """One request of a batch, as a pipeline sees it."""

    @property
    def job_id(self) -> str: ...

    @property
    def input(self) -> JobInput: ...

    @property
    def done(self) -> bool: ...

    @property
    def files(self) -> Files:
        """The job's files (raises where the worker has no storage)."""
        ...

    def cancelled(self) -> bool:
        """True once the job's owner asked to cancel it: stop at the next step."""
        ...

    def partial(self, data: dict[str, Any]) -> None:
        """Emit a partial output (an ASR segment, a TTS chunk, LLM tokens)."""
        ...

    def progress(self, step: int, total: int, **extra: Any) -> None:
        """Emit a progress event."""
        ...

    def succeed(self, output: dict[str, Any]) -> None:
        """Finish this request with its final output."""
        ...

    def fail(self, error: BaseException) -> None:
        """Finish this request with an error (`jobs.errors.InputError` for bad input)."""
        ...

    def drop_canceled(self) -> None:
        """Finish this request as canceled; the rest of the batch goes on."""
        ...


class Pipeline(ABC):
    """A model behind one kind: load, warm up, run batches, unload."""

    kind: ClassVar[str]
    input_model: ClassVar[type[JobInput]]

    def __init__(self, config: PipelineConfig, settings: Settings) -> None:
        self.config = config
        """The pipeline's settings; a pipeline may adjust its batching knobs here (the
        worker runs its engine and Celery consumer with these)."""
        self.settings = settings
        self.name = config.kind
        """The pipeline's name in settings (`[pipelines.NAME]`); the worker sets it."""

    @abstractmethod
    def load(self) -> None:
        """Load the model onto the worker's device."""

    def warmup(self) -> None:  # noqa: B027 - optional hook
        """Run once after load, before the first job."""

    def batch_key(self, request: JobInput) -> Hashable | None:
        """Requests with equal keys may share a batch; None: this request runs alone."""
        return None

    @abstractmethod
    def run(self, batch: Sequence[Request]) -> None:
        """Run one batch and finish every request in it (succeed, fail or drop_canceled)."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Free the model."""

    def describe(self) -> dict[str, Any]:
        """What /v1/models and logs show about this pipeline."""
        return {"kind": self.kind, "model": self.config.model}
