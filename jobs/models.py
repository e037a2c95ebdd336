"""Pydantic models of jobs and events, as stored and as the API shows them."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import orjson
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from jobs.settings import MAX_QUEUE_S, JobPriority, Priority
from jobs.states import JobStatus, ends_job
from jobs.webhooks import EVENT_CHOICES


class EventType(StrEnum):
    STATUS = "status"
    PARTIAL = "partial"
    PROGRESS = "progress"
    OUTPUT = "output"
    ERROR = "error"


class Event:
    """One event of a job; `id` is its Redis stream id, so a client can resume after it.

    Not a pydantic model: an API process makes one for every token of every stream it
    serves, from a notice or a stream entry that the store's own script wrote, so there is
    nothing to validate, and whether it ends its job is worked out once, here. An event
    read from Redis keeps its data as the JSON it was written as (`raw`) and decodes it
    only when something reads `data`: a stream that frames events as they are (the job
    API's SSE, an LLM token's chunk) never decodes them. `text_at`, where not 0, says
    that the event is a partial whose data is `{"index": i, "text": …}` written by the
    worker with the text last: its JSON string starts at `raw[text_at]` and ends before
    the closing brace (`text_literal`)."""

    __slots__ = ("_data", "ends", "id", "job_id", "raw", "text_at", "ts", "type")

    def __init__(
        self,
        *,
        id: str,
        job_id: str,
        type: EventType | str,
        ts: float,
        data: dict[str, Any] | None = None,
        raw: bytes = b"",
        text_at: int = 0,
    ) -> None:
        self.id = id
        self.job_id = job_id
        self.type = _EVENT_TYPES[type]
        self._data = data
        self.raw = raw
        """The data's JSON as stored (b"" where the event was made from `data`)."""
        self.text_at = text_at
        self.ts = ts
        self.ends = self.type is EventType.STATUS and ends_job(self.type, self.data)
        """Whether this is its job's terminal status event."""

    @property
    def data(self) -> dict[str, Any]:
        """As stored: a status, an output, an error, or a pipeline's partial or progress
        (`jobs.outputs` has the built-in kinds' shapes; another pipeline has its own)."""
        if self._data is None:
            self._data = orjson.loads(self.raw)
        return self._data

    @property
    def text_literal(self) -> bytes:
        """A text partial's text as its JSON string literal, quotes and escapes included
        (b"" for another event)."""
        return self.raw[self.text_at : -1] if self.text_at else b""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        mine = (self.id, self.job_id, self.type, self.data, self.ts)
        return mine == (other.id, other.job_id, other.type, other.data, other.ts)

    __hash__ = None  # type: ignore[assignment]  # mutable data, as a pydantic model's

    def __repr__(self) -> str:
        return (
            f"Event(id={self.id!r}, job_id={self.job_id!r}, type={self.type!r}, data={self.data!r})"
        )


_EVENT_TYPES: dict[str, EventType] = {t.value: t for t in EventType}
"""An event type by its value (or itself): faster than `EventType(value)`, once per event."""


class JobErrorInfo(BaseModel):
    type: str
    """`invalid_input` (never retried), `pipeline_error`, `worker_lost`."""
    message: str
    field: str | None = None
    """For `invalid_input`: the input field at fault."""


class Timings(BaseModel):
    """A job's timings, in milliseconds: the first four from its timestamps, for every
    kind; the rest are its pipeline's own, measured on the worker, where the kind has them
    (None elsewhere):

    - asr: `first_segment_ms`
    - tts: `first_audio_ms`, `synthesis_ms`
    - image: `first_step_ms`
    - llm: `ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_ms`
    - any kind served on demand: `load_ms`
    """

    queue_wait_ms: float | None = None
    """From submit (or the last requeue) to the start of the run."""
    time_to_first_output_ms: float | None = None
    """From submit to the first partial output or progress event."""
    run_ms: float | None = None
    """From the start of the run to its end."""
    total_ms: float | None = None
    """From submit to the end."""
    ttft_ms: float | None = None
    """LLM: from the request reaching the engine to its first token."""
    tpot_ms: float | None = None
    """LLM: time per output token after the first, (e2e - ttft) / (tokens - 1)."""
    itl_ms: float | None = None
    """LLM: mean gap between streamed chunks."""
    e2e_ms: float | None = None
    """LLM: from the request reaching the engine to its last token."""
    first_segment_ms: float | None = None
    """ASR: from the start of its batch's decoding (its audio read) to its first segment."""
    first_audio_ms: float | None = None
    """TTS: from the start of synthesis to the first chunk of audio."""
    load_ms: float | None = None
    """On demand: how long the job waited for its pipeline's model to load (and for
    room on its device)."""
    synthesis_ms: float | None = None
    """TTS: from the start of synthesis to the last chunk of audio."""
    first_step_ms: float | None = None
    """Image: from the start of its batch's diffusers call to the end of the first step."""


BATCH_IDS_MAX = 32
"""Ids a job's `BatchInfo` keeps at most (each job of a batch carries them: a batch of
256 must not write 256 x 256 ids)."""


class BatchInfo(BaseModel):
    """The batch a job ran in on its worker (the last run, where it ran more than once)."""

    id: str
    """Unique per batch: jobs with the same id ran together."""
    size: int
    """Jobs in the batch."""
    job_ids: list[str]
    """The batch's jobs, this one included (the first `BATCH_IDS_MAX` where larger)."""


EventChoice = Annotated[str, Field(json_schema_extra={"enum": sorted(EVENT_CHOICES)})]
"""An event type a webhook may ask for: published as the choices that `_known` checks
(which refuses the others with one message naming them all)."""


class WebhookSpec(BaseModel):
    """Where a job's (or a batch's) events are POSTed, signed. Refused (422) where the
    deployment has no signing secret (`webhooks.secret`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    url: str = Field(min_length=1, max_length=2048)
    """Where each event is POSTed (http or https; public addresses unless the
    deployment's `net` settings allow others)."""
    events: list[EventChoice] = Field(
        default_factory=lambda: ["terminal"], min_length=1, max_length=8
    )
    """Event types to send: status, partial, progress, output, error, `terminal` (the last
    status event only, the default) or `all`."""

    @field_validator("events")
    @classmethod
    def _known(cls, events: list[str]) -> list[str]:
        unknown = sorted(set(events) - EVENT_CHOICES)
        if unknown:
            raise ValueError(f"unknown event types {unknown}; use {sorted(EVENT_CHOICES)}")
        return events


MetadataKey = Annotated[str, Field(min_length=1, max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class JobCreate(BaseModel):
    """Body of `POST /v1/jobs`. The API validates `input` with the input model of `kind`
    (`jobs.schemas`), and the OpenAPI document shows one body per kind (`api.openapi`)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    kind: str = Field(min_length=1, max_length=64)
    input: dict[str, Any]  # the kind's input model validates it (`jobs.schemas`)
    priority: Priority = "normal"
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=32)
    """Up to 32 pairs of your own, kept with the job: keys up to 64 characters, values up
    to 512 (OpenAI's limits on its own metadata; the list of jobs carries them)."""
    webhook: WebhookSpec | None = None
    deadline: AwareDatetime | None = None
    """When the answer is no longer wanted (RFC 3339 with a zone, or unix seconds), in
    the future: a job still queued then ends `expired` and never runs."""
    max_queue_s: float | None = Field(default=None, gt=0, le=MAX_QUEUE_S)
    """The same, as seconds from now: the longest the job may wait for a worker (the
    pipeline's `max_queue_s` where not given). With `deadline` too, the earlier wins."""
    cancel_at_deadline: bool = False
    """A job still running at its deadline is canceled too (its partial outputs stay).
    Needs a deadline: `deadline`, `max_queue_s` or the pipeline's `max_queue_s`."""


class Job(BaseModel):
    """A job record."""

    id: str
    kind: str
    pipeline: str
    status: JobStatus
    owner: str
    priority: JobPriority
    # Any kind's JSON, kept as it is: the input as submitted (the kind's input model
    # checks it), the output as its pipeline made it (`jobs.outputs.JobOutput`).
    input: dict[str, Any]
    output: dict[str, Any] | None = None
    error: JobErrorInfo | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    attempts: int = 0
    created_at: float
    queued_at: float
    started_at: float | None = None
    first_output_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    webhook: WebhookSpec | None = None
    extra_timings: dict[str, float] = Field(default_factory=dict)
    """Pipeline-specific timings (see `Timings`), merged into `timings`."""
    worker: str | None = None
    """The worker of its last run (`pipeline-instance@host.pid`)."""
    batch: BatchInfo | None = None
    """The batch its last run ended in, where a worker ran it."""
    deadline: float | None = None
    """Unix seconds after which it is not run (`JobCreate.deadline`, `max_queue_s`)."""
    cancel_at_deadline: bool = False
    traceparent: str | None = None
    """The W3C trace context of its admission span, where tracing is on (`[tracing]`): the
    spans of its queue wait, runs and webhooks are its children (`telemetry.tracing`)."""

    @property
    def timings(self) -> Timings:
        return timings_of(
            self.created_at,
            self.queued_at,
            self.started_at,
            self.first_output_at,
            self.finished_at,
            self.extra_timings,
        )


def timings_of(
    created_at: float,
    queued_at: float,
    started_at: float | None,
    first_output_at: float | None,
    finished_at: float | None,
    extra: dict[str, float],
) -> Timings:
    """A job's timings from its timestamps and its pipeline's own (`extra_timings`)."""
    t = Timings(**{k: v for k, v in extra.items() if k in Timings.model_fields})
    if started_at is not None:
        t.queue_wait_ms = _ms(started_at - queued_at)
    if first_output_at is not None:
        t.time_to_first_output_ms = _ms(first_output_at - created_at)
    if finished_at is not None:
        t.total_ms = _ms(finished_at - created_at)
        if started_at is not None:
            t.run_ms = _ms(finished_at - started_at)
    return t


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def iso(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=UTC)
