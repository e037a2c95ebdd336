"""The one job state machine.

```
queued ──> running ──> succeeded | failed | canceled
  │  ^         │
  │  └─────────┘  (the reaper taking a dead worker's job back; a run giving its job back:
  │                 preempted for interactive work, or its worker stopping)
  ├──> canceled
  └──> expired    (its deadline passed before it ran: it never runs)
```

Every status change goes through `check_transition`; the store writes it atomically. A
job has ended when its status is terminal, and a job's events have ended with its
terminal status event (`ends_job`): the one definition that streams, waits and webhooks
use.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.EXPIRED})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELED, JobStatus.EXPIRED}),
    JobStatus.RUNNING: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.QUEUED}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELED: frozenset(),
    JobStatus.EXPIRED: frozenset(),
}


TERMINAL_VALUES = frozenset(str(status) for status in TERMINAL)


def ends_job(etype: str, data: Mapping[str, Any]) -> bool:
    """Whether an event of type `etype` with `data` is its job's terminal status event."""
    return etype == "status" and data.get("status") in TERMINAL_VALUES


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
