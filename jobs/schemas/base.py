"""Base of every kind's input schema."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, JsonValue

from jobs.errors import InputError
from jobs.outputs import JobOutput
from jobs.settings import Limits, PipelineConfig, Settings

COUNT_MAX = 2**31 - 1
"""The largest count a request may name (tokens, steps, images, dimensions): what an
engine's 32-bit field holds. The deployment's `limits` refuse far smaller ones; this bound
keeps a 10**30 from reaching code that cannot hold it (a 422, not a 500)."""
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""A seed is a signed 64-bit number."""


@dataclass(frozen=True)
class CachePolicy:
    """Where a deterministic request's answer is cached, and for how long."""

    digest: str
    """Hash of everything that decides the answer (model and parameters)."""
    ttl_s: float


class JobInput(BaseModel):
    """Input of a job kind. Unknown fields are refused. The docstrings of its fields are
    their descriptions in the OpenAPI document (`api.openapi`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str | None = None
    """A pipeline of the kind, by its name, model or one of its aliases (the
    deployment's configuration says which: `GET /v1/models` lists them); default: the
    kind's first enabled pipeline."""

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Self:
        """The input of a stored job (`record()` as the API stored it), for its worker:
        validated again by default. A kind whose worker forwards its input as it is (LLM
        requests) reads it without a second validation."""
        return cls.model_validate(record)

    def record(self) -> dict[str, JsonValue]:
        """The input as the job stores it: validated, with defaults filled in."""
        return self.model_dump(mode="json")

    def check_limits(self, limits: Limits) -> None:
        """Raise `InputError` for a value over a deployment limit (settings)."""

    def check_pipeline(self, config: PipelineConfig) -> None:
        """Raise `InputError` for a value that the chosen pipeline does not serve (a voice,
        a scheduler); reads settings only, so the API calls it at submit."""

    def route(self, pipeline: str, settings: Settings) -> str:
        """The pipeline that runs this request, given the one its kind and model chose
        (e.g. long LLM prompts go to their own engine); the API calls it at submit."""
        return pipeline

    def cache_policy(self, config: PipelineConfig) -> CachePolicy | None:
        """How to cache this request's answer; None (the default): never cached."""
        return None

    def file_refs(self) -> list[tuple[str, str]]:
        """(field, reference) of each file this input names below its top level (an LLM
        request's image parts); the top-level file fields are marked in the schema
        (`jobs.filerefs`)."""
        return []

    def cost(self) -> int:
        """What the job counts against its key's cost quota for its kind when it is
        admitted (`jobstore.quotas.COST_UNITS`); 0 where it is known only at the end."""
        return 0

    def cost_after(self, output: JobOutput) -> int:
        """What the job counts when it succeeds, where its cost was not known at
        admission (ASR: the audio's seconds)."""
        return 0


def over_limit(field: str, value: float, limit: float, unit: str = "") -> InputError:
    suffix = f" {unit}" if unit else ""
    return InputError(field, f"{value}{suffix} is over the limit of {limit}{suffix}")
