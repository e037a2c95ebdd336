"""The named job operations: what a caller means, each one `Transition` of the one
transition script, with its source states and its lease rule inside.

| operation | change | lease |
| --- | --- | --- |
| `start` | queued -> running | taken (`acquire`): no live lease of another run |
| `succeed`, `fail`, `cancel_running` | running -> the end | held (`check`): only its run ends it |
| `cancel_queued` | queued -> canceled | none (no run exists) |
| `expire`, `expire_by_id` | queued -> expired | none (its deadline passed: it never runs) |
| `requeue_preempted` | running -> queued | held (`check`): its run stopped for interactive work |
| `hand_back` | running -> queued | held (`check`): its worker is stopping (SIGTERM) |
| `requeue_lost`, `fail_lost` | running -> queued / failed | gone (`absent`): its worker was lost |
| `answer_from_cache` | queued -> running -> succeeded | a lease of its own for the two steps |

No caller outside this module spells a lease mode or a set of source states.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import replace

from broker.kombu_redis import TaskMessage
from jobs.models import EventType, Job
from jobs.outputs import JobOutput
from jobs.states import JobStatus
from jobs.wire import JobError
from jobstore.changes import (
    ALL_FIELDS,
    Lease,
    PreEvent,
    StatusData,
    Transition,
    transition,
)
from jobstore.codec import dumps

QUEUED = frozenset({JobStatus.QUEUED})
RUNNING = frozenset({JobStatus.RUNNING})
CACHE_LEASE_TTL_MS = 30_000
"""The lease under which a cached answer ends its job (two script calls, not a run)."""


def start(job_id: str, kind: str, lease: Lease, worker: str) -> Transition:
    """A worker takes a queued job known by its id alone; the script returns the whole
    job as it is after the change (no read before it). The status event names the worker,
    so a client can tell which run an event belonged to after a fault moved the job on."""
    return Transition(
        job_id=job_id,
        target=JobStatus.RUNNING,
        sources=QUEUED,
        fields={"started_at": _now(), "worker": worker},
        event_data={"worker": worker},
        lease_mode="acquire",
        lease=lease,
        kind=kind,
        read_back=ALL_FIELDS,
    )


def cancel_queued(job: Job) -> Transition:
    """End a queued job whose cancel was asked for (no run to stop)."""
    return transition(job, JobStatus.CANCELED, sources=QUEUED, fields={"finished_at": _now()})


def cancel_queued_by_id(job_id: str, kind: str) -> Transition:
    """`cancel_queued` for a job known by its id alone (a worker that took the task of a
    job canceled in the queue); the script reads the job back for its webhook."""
    return _end_queued_by_id(job_id, kind, JobStatus.CANCELED, {})


DEADLINE_PASSED: StatusData = {"reason": "deadline"}
"""The data of an `expired` status event, and of the `canceled` one of a job canceled at
its deadline (`cancel_at_deadline`)."""


def expire(job: Job) -> Transition:
    """End a queued job whose deadline has passed: it never runs (the reaper's sweep)."""
    return transition(
        job,
        JobStatus.EXPIRED,
        sources=QUEUED,
        fields={"finished_at": _now()},
        event_data=DEADLINE_PASSED,
    )


def expire_by_id(job_id: str, kind: str) -> Transition:
    """`expire` for a job known by its id alone (a worker whose start was refused because
    the deadline had passed); the script reads the job back for its webhook."""
    return _end_queued_by_id(job_id, kind, JobStatus.EXPIRED, DEADLINE_PASSED)


def _end_queued_by_id(
    job_id: str, kind: str, target: JobStatus, event_data: StatusData
) -> Transition:
    return Transition(
        job_id=job_id,
        target=target,
        sources=QUEUED,
        fields={"finished_at": _now()},
        event_data=event_data,
        kind=kind,
        read_back=ALL_FIELDS,
    )


def succeed(
    job: Job, lease: Lease, output: JobOutput, fields: dict[str, str] | None = None
) -> Transition:
    """The run holding `lease` ends the job with `output` (its output event first)."""
    return _end(
        job, JobStatus.SUCCEEDED, lease,
        {"output": dumps(output), **(fields or {})}, PreEvent(EventType.OUTPUT, output),
    )  # fmt: skip


def fail(
    job: Job, lease: Lease, error: JobError, fields: dict[str, str] | None = None
) -> Transition:
    """The run holding `lease` ends the job failed, with the reason (an error event first;
    the status event carries it too)."""
    change = _end(
        job, JobStatus.FAILED, lease,
        {"error": dumps(error), **(fields or {})}, PreEvent(EventType.ERROR, error),
    )  # fmt: skip
    return replace(change, event_data={"error": error})


def cancel_running(
    job: Job, lease: Lease, fields: dict[str, str] | None = None, *, at_deadline: bool = False
) -> Transition:
    """The run holding `lease` stopped on a cancel: the job ends canceled (`at_deadline`:
    the cancel was its deadline's, and the status event says so)."""
    change = _end(job, JobStatus.CANCELED, lease, fields or {}, None)
    return replace(change, event_data=DEADLINE_PASSED) if at_deadline else change


def requeue_lost(job: Job, message: TaskMessage) -> Transition:
    """A running job whose worker was lost (its lease is gone) is queued again, with a new
    task message pushed by the same script."""
    return transition(
        job,
        JobStatus.QUEUED,
        sources=RUNNING,
        lease_mode="absent",
        fields={"queued_at": _now(), "started_at": "", "first_output_at": ""},
        event_data={"reason": "worker_lost", "attempts": job.attempts},
        message=message,
    )


def requeue_preempted(job: Job, lease: Lease, message: TaskMessage) -> Transition:
    """The run holding `lease` stopped a batch line for interactive work (`batches.preempt`):
    the job is queued again with a new task message, and the run does not count as one of
    its attempts."""
    return _requeue_held(job, lease, message, "preempted", {"preempt_requested": ""})


def hand_back(job: Job, lease: Lease, message: TaskMessage) -> Transition:
    """The run holding `lease` gives the job back because its worker is stopping (SIGTERM,
    `worker.shutdown_grace_s`): queued again with a new task message, the run not counted
    as one of its attempts. Refused (and the job left alone) once the lease is not this
    run's: the job ended, or the reaper took it back after the lease ran out."""
    return _requeue_held(job, lease, message, "shutdown", {})


def _requeue_held(
    job: Job, lease: Lease, message: TaskMessage, reason: str, fields: dict[str, str]
) -> Transition:
    """Queued again by the run that holds its lease, which gives up the attempt its start
    counted (`job.attempts` as the start read it back: under the lease, no other start
    counted one since)."""
    return transition(
        job,
        JobStatus.QUEUED,
        sources=RUNNING,
        lease_mode="check",
        lease=lease,
        fields={
            "queued_at": _now(),
            "started_at": "",
            "first_output_at": "",
            "attempts": str(max(0, job.attempts - 1)),
            **fields,
        },
        event_data={"reason": reason},
        message=message,
    )


def fail_lost(job: Job, error: JobError) -> Transition:
    """A running job whose worker was lost once too often ends failed, with the reason."""
    return transition(
        job,
        JobStatus.FAILED,
        sources=RUNNING,
        lease_mode="absent",
        fields={"error": dumps(error), "finished_at": _now()},
        event_data={"error": error},
        pre_event=PreEvent(EventType.ERROR, error),
    )


def answer_from_cache(job: Job, output: JobOutput) -> tuple[Transition, Transition]:
    """A new job answered from the response cache: it starts and succeeds through the
    usual changes, under a lease of its own, without a worker (apply them in order; the
    second reads the whole job back)."""
    lease = Lease(token=f"response-cache:{secrets.token_hex(8)}", ttl_ms=CACHE_LEASE_TTL_MS)
    started = transition(
        job,
        JobStatus.RUNNING,
        sources=QUEUED,
        lease_mode="acquire",
        lease=lease,
        fields={"started_at": _now(), "worker": "response-cache"},
    )
    return started, replace(succeed(job, lease, output), read_back=ALL_FIELDS)


def _end(
    job: Job,
    target: JobStatus,
    lease: Lease,
    fields: dict[str, str],
    pre_event: PreEvent | None,
) -> Transition:
    return transition(
        job,
        target,
        sources=RUNNING,
        lease_mode="check",
        lease=lease,
        fields={"finished_at": _now(), **fields},
        pre_event=pre_event,
    )


def _now() -> str:
    return repr(time.time())
