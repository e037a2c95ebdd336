"""`[autoscale]`: what `/metrics` tells an autoscaler (KEDA, an HPA on Prometheus) of each
pipeline, and what `/readyz` says of pipelines without workers (`api/autoscale.py`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class AutoscaleSettings(BaseModel):
    target_wait_s: float = Field(default=30.0, gt=0)
    """How long the jobs waiting and running now may take to be done:
    `mmq_pipeline_desired_workers` asks for the slots that run them all within it, at the
    pipeline's measured service time. 30 s: about what a GPU worker takes to start and
    load its model, and KEDA's default polling interval; a shorter target asks for
    workers that come after the backlog they were for is gone."""
    max_workers: int = Field(default=100, ge=1)
    """The most `mmq_pipeline_desired_workers` asks for, per pipeline (a flood of jobs
    never asks for an absurd fleet; the ScaledObject's `maxReplicaCount` bounds it too)."""
    ready_without_workers: bool = False
    """`/readyz` answers 200 while a kind has no live worker (they are named in its
    `no_workers`, and their jobs wait queued): set it where workers scale to zero, so
    that the API stays in its Service. Off: a kind without a live worker makes it 503."""
