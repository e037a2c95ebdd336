"""Queue routing: which pipeline (and so which Celery queue) serves a job, at what priority."""

from __future__ import annotations

from typing import NamedTuple

from jobs.errors import InputError
from jobs.settings import PipelineConfig, Priority, Settings

TASK_NAME = "mmq.run_job"
"""The Celery task that runs one job on a pipeline worker."""

# Redis transport: lower numbers are served first (kombu's priority_steps 0, 3, 6, 9).
PRIORITY_VALUES: dict[str, int] = {"high": 0, "normal": 3, "low": 6}
PRIORITY_STEPS = [0, 3, 6, 9]
QUEUE_SEP = ":"
"""Between a queue's name and a priority step in the names of kombu's Redis lists."""


def queue_name(pipeline: str) -> str:
    return f"mmq.{pipeline}"


class TaskMessage(NamedTuple):
    """A task message as kombu's Redis transport stores it: its list and its envelope."""

    list_key: str
    envelope: str


def celery_list(queue: str, priority: int, sep: str = QUEUE_SEP) -> str:
    """The Redis list that holds a queue's messages of one priority step (kombu's naming:
    the highest priority has the bare queue name)."""
    return f"{queue}{sep}{priority}" if priority else queue


def celery_priority(priority: Priority) -> int:
    return PRIORITY_VALUES[priority]


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
    names = {name, *config.aliases}
    if config.model:
        names.add(config.model)
    return names
