"""The JSON shapes that clients read (`jobs.wire`, `jobs.outputs`: TypedDicts, so the Python
client and the tune import no pydantic model) say what the API's own models publish: the
same fields, each side. A field added to one and not the other fails here."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from api.openai import batch_models, transcription_models
from api.views import JobView
from jobs import models, outputs, wire

PAIRS: list[tuple[Any, type[BaseModel], set[str]]] = [
    (wire.Job, JobView, set()),
    (wire.Timings, models.Timings, set()),
    (wire.OpenAIBatch, batch_models.Batch, {"owner"}),  # mmq's own, shown to admin keys only
    (wire.RequestCounts, batch_models.BatchRequestCounts, set()),
    (wire.BatchErrors, batch_models.BatchErrors, set()),
    (wire.BatchError, batch_models.BatchError, set()),
    (outputs.Segment, transcription_models.TranscriptionSegment, {"words"}),
]
"""Each client-side shape, the API's model of it, and the fields only one side has on
purpose (a segment's `words` is in the job's output; OpenAI's verbose_json carries them
beside the segments)."""


def _keys(shape: Any) -> set[str]:
    if isinstance(shape, type) and issubclass(shape, BaseModel):
        return set(shape.model_fields)
    return set(shape.__required_keys__ | shape.__optional_keys__)


@pytest.mark.parametrize(
    ("shape", "model", "apart"), PAIRS, ids=lambda p: getattr(p, "__name__", "")
)
def test_a_client_shape_has_the_fields_of_the_apis_model(
    shape: Any, model: type[BaseModel], apart: set[str]
) -> None:
    assert _keys(shape) ^ _keys(model) == apart
