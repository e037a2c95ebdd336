"""Base of every kind's input schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from jobs.errors import InputError
from jobs.settings import Limits


class JobInput(BaseModel):
    """Input of a job kind. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    """Model (pipeline name or alias); default: the kind's first enabled pipeline."""

    def check_limits(self, limits: Limits) -> None:
        """Raise `InputError` for a value over a deployment limit (settings)."""


def over_limit(field: str, value: float, limit: float, unit: str = "") -> InputError:
    suffix = f" {unit}" if unit else ""
    return InputError(field, f"{value}{suffix} is over the limit of {limit}{suffix}")
