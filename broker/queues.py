"""Queue routing: which pipeline (and so which Celery queue) serves a job."""

from __future__ import annotations

from jobs.errors import InputError
from jobs.settings import PipelineConfig, Settings

TASK_NAME = "mmq.run_job"
"""The Celery task that runs one job on a pipeline worker."""


def queue_name(pipeline: str) -> str:
    return f"mmq.{pipeline}"


def pipeline_for(settings: Settings, kind: str, model: str | None) -> str:
    """The enabled pipeline that serves `kind` (and `model`, when given).

    Raises `InputError` naming `kind` or `input.model` when nothing serves it.
    """
    candidates = [(n, p) for n, p in settings.enabled_pipelines.items() if p.kind == kind]
    if not candidates:
        enabled = ", ".join(settings.enabled_kinds) or "none"
        raise InputError("kind", f"no pipeline serves kind {kind!r} here (enabled: {enabled})")
    if model is None:
        return candidates[0][0]
    for name, config in candidates:
        if model in _names(name, config):
            return name
    served = sorted(n for name, c in candidates for n in _names(name, c))
    raise InputError("input.model", f"unknown model {model!r} for {kind} (served: {served})")


def _names(name: str, config: PipelineConfig) -> set[str]:
    """What a request may call the pipeline: as `GET /v1/models` lists it (its model by
    hub id, never by a path on the host)."""
    names = {name, *config.aliases, *config.adapters()}
    model = config.public_model()
    if model:
        names.add(model)
    return names
