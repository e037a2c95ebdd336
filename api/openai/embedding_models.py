"""The request of `POST /v1/embeddings` and the `embed` job input it becomes (also a
batch's line's, `api.openai.batch_lines`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.openai.common import CLOSED, refuse_fields
from jobs.errors import InputError

PARAMS: dict[str, str] = {}
"""Job input fields under another name in OpenAI's request (none)."""
NOT_CARRIED = {"user": "not carried"}


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra=CLOSED)

    input: str | list[str] | list[int] | list[list[int]]
    model: str = Field(min_length=1, max_length=256)
    """An embed pipeline or one of its aliases (`text-embedding-3-small`...)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)


def job_input(body: EmbeddingRequest) -> dict[str, Any]:
    """The `embed` job input of a request; InputError for what it cannot serve."""
    refuse_fields(body.model_extra, NOT_CARRIED)
    texts = body.input if isinstance(body.input, list) else [body.input]
    if not all(isinstance(text, str) for text in texts):
        raise InputError("input", "token arrays are not served: send the text")
    inp: dict[str, Any] = {"model": body.model, "input": texts}
    if body.dimensions is not None:
        inp["dimensions"] = body.dimensions
    return inp
