"""The indexes a job listing reads (`AsyncJobStore.list_ids`, `forget`): an owner's jobs,
or every owner's (an admin's), each scored by creation time. Callers hold a `JobIndex`
from `jobs_of`, never its key."""

from __future__ import annotations

from typing import NewType

from jobs import keys

JobIndex = NewType("JobIndex", str)


def jobs_of(owner: str | None) -> JobIndex:
    """The index of `owner`'s jobs; of every owner's for None."""
    return JobIndex(keys.ALL_JOBS if owner is None else keys.owner_jobs(owner))
