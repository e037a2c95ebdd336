"""The models counted on each device (`keys.device_models`): one JSON entry per worker,
written by the worker (`workers.residency`) and read by the scheduler, `/metrics`,
`/readyz` and the console. Its shape lives here once."""

from __future__ import annotations

from pydantic import BaseModel


class ModelEntry(BaseModel):
    """What one worker's model takes on its device."""

    pipeline: str
    bytes: int
    """Its estimate (`memory_gb`, or the model's files); 0: unknown."""
    resident: bool
    """Loaded when the worker started (never made to give up its room)."""
    loaded_at: float = 0.0
    idle_since: float = 0.0
    """When it last had no job; 0 while it has work (or while it loads)."""
    slots: int = 1
    """Jobs its worker runs at once (an LLM engine's `max_inflight`)."""
    busy: int = 0
    """Jobs its worker ran when it last went idle, busy or full (written then, not at
    every job: `workers.residency.OnDemand`)."""

    def takes_more(self) -> bool:
        """Loaded, with a free slot: a job for its pipeline may go to it rather than load
        a second copy elsewhere."""
        return (
            not self.resident and self.busy < self.slots and (self.busy > 0 or self.idle_since > 0)
        )


def device_member(host: str, device: str) -> str:
    """A device's name in `keys.MODEL_DEVICES`."""
    return f"{host}|{device}"


def split_member(member: str) -> tuple[str, str]:
    """(host, device) of a `keys.MODEL_DEVICES` member."""
    host, _, device = member.partition("|")
    return host, device
