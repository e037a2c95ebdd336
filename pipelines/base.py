"""The protocol between the worker engine and a pipeline.

The engine owns batching, cancel, events and timings; a pipeline only says how to load
its model, which requests may share a batch (`batch_key`), how to set up one request
(`prepare`) and how to run a batch of prepared requests (`run`). A pipeline declares its
input type once, as its first type parameter: `class TtsPipeline(Pipeline[TtsInput, Plan])`.

What a pipeline may raise, and what the engine does with it:

    jobs.errors.InputError   from prepare: that request fails as invalid_input
    Exception                from prepare: that request fails (logged); from run: the
                             unfinished requests of the batch fail
    Canceled                 from run: every request of the batch was canceled
    BackendLost              from run: the batch goes back to the queue
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Generic, Protocol, TypeVar

from jobs.outputs import JobOutput, PartialData, StoredFile
from jobs.schemas.base import JobInput
from jobs.settings import PipelineConfig, Settings
from storage.base import Data

InputT = TypeVar("InputT", bound=JobInput)
InputT_co = TypeVar("InputT_co", bound=JobInput, covariant=True)
PreparedT = TypeVar("PreparedT")


class Canceled(Exception):
    """Raised by a pipeline that stopped because every request of its batch was canceled."""


class BackendLost(Exception):
    """Raised by a pipeline whose backend went away mid-batch (an engine server died):
    not the requests' fault, so each one goes back to the queue through its lease and
    runs again (counting an attempt), instead of failing."""


TakePartial = Callable[[], tuple[bytes, bool, int] | None]
"""A request's pending partial output, taken by the worker when it writes next: (one
partial event's data as JSON, whether it is the job's first output, where in the data an
LLM token's text starts, 0 for none: `jobstore.store.NewEvent.text_at`), or None."""
Touch = Callable[[], None]
"""Says that a request has pending partial output (`Request.stream`)."""


class Files(Protocol):
    """A job's files: its inputs by reference, its outputs by name (in storage)."""

    def input_path(self, ref: str, field: str) -> contextlib.AbstractContextManager[Path]:
        """A local path of the file that input field `field` references, inside a `with`."""
        ...

    def open_input(self, ref: str, field: str) -> BinaryIO:
        """A stream of the file that input field `field` references. Close it."""
        ...

    def put_output(self, name: str, data: Data, content_type: str) -> StoredFile:
        """Store output `name` (bytes or a binary stream); returns its key, signed url,
        bytes, content_type and sha256 for the job's output."""
        ...


class Request(Protocol[InputT_co]):
    """One request of a batch, as a pipeline sees it."""

    @property
    def job_id(self) -> str: ...

    @property
    def input(self) -> InputT_co: ...

    @property
    def done(self) -> bool: ...

    @property
    def files(self) -> Files:
        """The job's files (raises where the worker has no storage)."""
        ...

    @property
    def canceled(self) -> bool:
        """True once the job's owner asked to cancel it."""
        ...

    def drop_if_canceled(self) -> bool:
        """At each step: True (and the request ends canceled) once a cancel was asked;
        the caller stops working on it, the rest of the batch goes on."""
        ...

    def partial(self, data: PartialData) -> None:
        """Emit a partial output (an ASR segment, a TTS chunk, LLM tokens)."""
        ...

    def stream(self, take: TakePartial) -> Touch:
        """For a pipeline that keeps its partial output itself, piece by piece (an LLM's
        tokens): returns `touch`, to call after each piece kept. The worker calls `take`
        when it writes next, on its own thread, and writes what it gives as one partial
        event: one append per job per write, encoded once, whatever the pieces."""
        ...

    def progress(self, step: int, total: int, **extra: Any) -> None:
        """Emit a progress event."""
        ...

    def record_timing(self, name: str, ms: float) -> None:
        """Add one of the kind's own timings (a field of `jobs.models.Timings`)."""
        ...

    def succeed(self, output: JobOutput) -> None:
        """Finish this request with its final output."""
        ...

    def fail(self, error: BaseException) -> None:
        """Finish this request with an error (`jobs.errors.InputError` for bad input)."""
        ...

    def drop_canceled(self) -> None:
        """Finish this request as canceled; the rest of the batch goes on."""
        ...


@dataclass(frozen=True)
class EngineKnobs:
    """How the worker's engine batches for a pipeline, and its Celery concurrency."""

    max_batch: int
    max_wait_ms: float
    runners: int
    concurrency: int
    inline: bool = False
    """Run each request on the thread that submits it (its task's), with no runner: for a
    backend that batches by itself (an LLM engine), where handing each request to a
    runner thread would only add a switch between threads."""

    @classmethod
    def of(cls, config: PipelineConfig) -> EngineKnobs:
        return cls(config.max_batch, config.max_wait_ms, config.runners, config.concurrency)


class Pipeline(ABC, Generic[InputT, PreparedT]):
    """A model behind one kind: load, warm up, prepare requests, run batches, unload.

    The engine calls `prepare` for each request of a batch, on the runner thread, just
    before `run`: an exception there fails that request alone (InputError: bad input),
    and `run` gets the others. A request canceled or finished before `run` is left out.
    """

    kind: ClassVar[str]

    def __init__(self, config: PipelineConfig, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.name = config.kind
        """The pipeline's name in settings (`[pipelines.NAME]`); the worker sets it."""

    @abstractmethod
    def load(self) -> None:
        """Load the model onto the worker's device."""

    def warmup(self) -> None:
        """Run once after load, before the first job."""

    def knobs(self) -> EngineKnobs:
        """The engine's batching knobs and the worker's concurrency (default: settings)."""
        return EngineKnobs.of(self.config)

    def batch_key(self, request: InputT) -> Hashable | None:
        """Requests with equal keys may share a batch; None: this request runs alone."""
        return None

    @abstractmethod
    def prepare(self, request: Request[InputT]) -> PreparedT:
        """Set up one request (fetch its inputs, check it against the model)."""

    @abstractmethod
    def run(self, batch: Sequence[PreparedT]) -> None:
        """Run one batch and finish every request in it (succeed, fail or drop_canceled)."""

    def merge_partials(self, first: PartialData, then: PartialData) -> PartialData | None:
        """One partial output's data for two consecutive ones of a request, or None (the
        default) to keep them apart. The worker merges partials that wait while an earlier
        write is in flight (e.g. LLM tokens into one delta); nothing waits for a merge."""
        return None

    def unload(self) -> None:
        """Free the model."""

    def park(self) -> bool:
        """Free the device's memory but keep what makes the next `load` fast (an LLM
        engine's sleep mode); False (the default) where the pipeline cannot, and the
        worker unloads it instead. `unload` frees a parked model for good."""
        return False

    def readings(self) -> dict[str, float]:
        """What the backend says of itself now (an engine server's sequences running and
        waiting, its KV cache's use), for `/metrics`; empty (the default) where it says
        nothing. Called from the worker's metrics thread: quick, and never raises."""
        return {}


class SimplePipeline(Pipeline[InputT, Request[InputT]]):
    """A pipeline with nothing to set up per request: `run` gets the requests."""

    def prepare(self, request: Request[InputT]) -> Request[InputT]:
        return request
