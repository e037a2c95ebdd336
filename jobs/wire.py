"""The JSON of mmq's job API as its clients send and read it: the Python client
(`mmq.client`), `mmq submit`, the harness and the tune. TypedDicts, so a job or an
event is the plain dict that `json.loads` made (and nothing heavier is imported to read
one); the API's own models (`api.views.JobView`, `jobs.models.Event`) say the same. The
store writes the same shapes: a job's error, the event a webhook receives, and OpenAI's
batch object with its webhook's event.

A kind's input, output and partial data are its own JSON: its input model and its
pipeline decide their shape, and a deployment may add kinds of its own, so on the job
they are JSON objects (`dict[str, JsonValue]`). The built-in kinds' outputs and partials
are `jobs.outputs`' (`TtsOutput`, `Segment`...): a reader that knows the kind casts to
its type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NotRequired

from typing_extensions import TypedDict  # pydantic reads the batch ones (jobstore.batch_records)

if TYPE_CHECKING:
    from pydantic import JsonValue


class JobRequest(TypedDict):
    """The body of `POST /v1/jobs` (`jobs.models.JobCreate`); unset fields are not sent."""

    kind: str
    input: dict[str, JsonValue]
    priority: NotRequired[str]
    metadata: NotRequired[dict[str, str]]
    deadline: NotRequired[float | str]
    """Unix seconds, or RFC 3339 with a zone."""
    max_queue_s: NotRequired[float]
    cancel_at_deadline: NotRequired[bool]


class JobError(TypedDict):
    """Why a job failed: the job's `error`, and an error event's data."""

    type: str
    """`invalid_input` (never retried), `pipeline_error`, `worker_lost`..."""
    message: str
    field: NotRequired[str | None]
    """For `invalid_input`: the input field at fault (a job always shows it)."""


class Timings(TypedDict, total=False):
    """A job's timings in milliseconds (`jobs.models.Timings`: what each one measures).
    The API sends every key, null where the kind does not measure it."""

    queue_wait_ms: float | None
    time_to_first_output_ms: float | None
    run_ms: float | None
    total_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    itl_ms: float | None
    e2e_ms: float | None
    first_segment_ms: float | None
    first_audio_ms: float | None
    load_ms: float | None
    synthesis_ms: float | None
    first_step_ms: float | None


class BatchInfo(TypedDict):
    id: str
    size: int
    job_ids: list[str]


class JobUrls(TypedDict):
    self: str
    cancel: str
    retry: str
    events: str
    ws: str


class Job(TypedDict):
    """A job as the API shows it (`api.views.JobView`)."""

    id: str
    kind: str
    model: str
    status: str
    """queued, running, succeeded, failed, canceled or expired (`jobs.states.JobStatus`)."""
    priority: str
    input: dict[str, JsonValue]
    output: dict[str, JsonValue] | None
    error: JobError | None
    metadata: dict[str, str]
    owner: str
    attempts: int
    timings: Timings
    worker: str | None
    batch: BatchInfo | None
    created_at: str
    """RFC 3339, as the other times."""
    started_at: str | None
    finished_at: str | None
    deadline: str | None
    cancel_at_deadline: bool
    urls: JobUrls


class StatusData(TypedDict):
    status: str
    loading: NotRequired[str]
    """Running, but waiting for this pipeline's model to load first (on demand)."""
    worker: NotRequired[str]
    error: NotRequired[JobError]
    reason: NotRequired[str]
    """Why it changed where the change says: `deadline`, `worker_lost`, `preempted`,
    `shutdown` (its worker stopped and handed it back)."""
    attempts: NotRequired[int]


class ProgressData(TypedDict):
    step: int
    total: int
    preview: NotRequired[str]
    """Image: a small preview of the step, as a data URI."""


class _EventBase(TypedDict):
    id: str
    """The event's stream id: `Last-Event-ID` resumes after it."""
    job_id: str
    ts: float


class StatusEvent(_EventBase):
    type: Literal["status"]
    data: StatusData


class ProgressEvent(_EventBase):
    type: Literal["progress"]
    data: ProgressData


class ErrorEvent(_EventBase):
    type: Literal["error"]
    data: JobError


class KindEvent(_EventBase):
    """A partial output, or the output (its data is the job's `output`): the kind's own."""

    type: Literal["partial", "output"]
    data: dict[str, JsonValue]


Event = StatusEvent | ProgressEvent | ErrorEvent | KindEvent
"""One event of a job (`jobs.models.Event`), told apart by its `type`."""


class JobEvent(TypedDict):
    """A job's event as JSON (`jobs.models.Event`): what a webhook receives."""

    id: str
    job_id: str
    type: str
    data: dict[str, Any]
    """Its status, output, error, or a pipeline's partial or progress: any JSON object."""
    ts: float


class BatchError(TypedDict, total=False):
    """Why a batch failed as a whole: an item of OpenAI's `errors.data`."""

    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(TypedDict):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(TypedDict):
    total: int
    completed: int
    failed: int


class OpenAIBatch(TypedDict):
    """OpenAI's batch object (`Batch.openai`): what the API answers, and a batch
    webhook's event data."""

    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchEvent(TypedDict):
    """The event a batch's webhook receives when the batch ends (`end_event`)."""

    id: str
    batch_id: str
    type: str
    data: OpenAIBatch
    ts: float
