"""The `[worker]` settings group: how a worker process behaves as a whole (its pipelines'
knobs are in `[pipelines.NAME]`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    shutdown_grace_s: float = Field(default=25.0, ge=0)
    """On SIGTERM or SIGINT a worker takes no new job and lets the jobs it holds run this
    long (`MMQ_WORKER__SHUTDOWN_GRACE_S`); those still running then are stopped and handed
    back to the queue, without counting an attempt, and the process exits 0. The default
    fits Kubernetes' `terminationGracePeriodSeconds` of 30 with room for the hand-back and
    the model's unload."""
