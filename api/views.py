"""What the API shows of a job."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from jobs.models import BatchInfo, Job, JobErrorInfo, Timings, iso
from jobs.settings import JobPriority
from jobs.states import JobStatus


class JobUrls(BaseModel):
    self: str
    cancel: str
    retry: str
    events: str
    ws: str


class JobView(BaseModel):
    id: str
    kind: str
    model: str
    status: JobStatus
    priority: JobPriority
    input: dict[str, object]
    """What it was submitted with: its kind's input (`POST /v1/jobs`)."""
    output: dict[str, object] | None
    """What its pipeline made, once it succeeded (each kind's own)."""
    error: JobErrorInfo | None
    metadata: dict[str, str]
    owner: str
    attempts: int
    timings: Timings
    worker: str | None
    """The worker of its last run (`pipeline-instance@host.pid`)."""
    batch: BatchInfo | None
    """The batch its last run ended in: the ids of its batch mates (itself included)."""
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    deadline: datetime | None = None
    """After it, a queued job ends `expired` (and a running one is canceled where
    `cancel_at_deadline`)."""
    cancel_at_deadline: bool = False
    urls: JobUrls


class JobList(BaseModel):
    data: list[JobView]
    next_cursor: str | None


def job_view(job: Job, base_url: str) -> JobView:
    path = f"{base_url}/v1/jobs/{job.id}"
    ws_base = base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
    created = iso(job.created_at)
    assert created is not None
    return JobView(
        id=job.id,
        kind=job.kind,
        model=job.pipeline,
        status=job.status,
        priority=job.priority,
        input=job.input,
        output=job.output,
        error=job.error,
        metadata=job.metadata,
        owner=job.owner,
        attempts=job.attempts,
        timings=job.timings,
        worker=job.worker,
        batch=job.batch,
        created_at=created,
        started_at=iso(job.started_at),
        finished_at=iso(job.finished_at),
        deadline=iso(job.deadline),
        cancel_at_deadline=job.cancel_at_deadline,
        urls=JobUrls(
            self=path,
            cancel=f"{path}/cancel",
            retry=f"{path}/retry",
            events=f"{path}/events",
            ws=f"{ws_base}/v1/jobs/{job.id}/ws",
        ),
    )
