"""The one job state machine.

```
queued ──> running ──> succeeded | failed | canceled
  │  ^         │
  │  └─────────┘  (only the reaper, taking a dead worker's job back)
  └──> canceled | failed (failed only when the task could not be enqueued)
```

Every status change goes through `check_transition`; the store writes it atomically.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELED, JobStatus.FAILED}),
    JobStatus.RUNNING: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.QUEUED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELED: frozenset(),
}


class InvalidTransition(Exception):
    """A status change that the state machine does not allow."""

    def __init__(self, current: JobStatus, target: JobStatus) -> None:
        super().__init__(f"job cannot go from {current} to {target}")
        self.current = current
        self.target = target


def allowed_sources(target: JobStatus) -> frozenset[JobStatus]:
    """Every status from which `target` may be reached."""
    return frozenset(src for src, dests in TRANSITIONS.items() if target in dests)


def check_transition(current: JobStatus, target: JobStatus) -> None:
    """Raise `InvalidTransition` unless the table allows `current -> target`."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(current, target)
