"""Webhooks: which events a job's webhook wants (signatures: `security.signing`)."""

from __future__ import annotations

from typing import Any

from jobs.states import ends_job

EVENT_CHOICES = frozenset({"terminal", "status", "partial", "progress", "output", "error", "all"})


# `data` is the event's as the store holds it: any pipeline's JSON object.
def wants(events: list[str], etype: str, data: dict[str, Any]) -> bool:
    """Whether a webhook subscribed to `events` gets an event of `etype` with `data`."""
    if "all" in events or etype in events:
        return True
    return "terminal" in events and ends_job(etype, data)
