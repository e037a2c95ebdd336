"""`POST /v1/embeddings`, OpenAI-compatible: an `embed` job, answered when it ends.

`input` is a string or a list of strings (token arrays are refused by name: send text);
`encoding_format` is `float` (lists of numbers) or `base64` (little-endian float32, what
the official client asks for by default and decodes itself); `dimensions` where the
pipeline allows it. The job is batched with other requests' texts by the worker.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Owner
from api.deps import Service
from api.openai.common import CLOSED, Deadline, answer_when_ended, refuse_fields
from jobs.errors import InputError
from jobs.models import Job, JobCreate

router = APIRouter(prefix="/v1", tags=["openai"])

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


@router.post("/embeddings", responses={413: {}, 422: {}, 429: {}})
async def create_embeddings(
    request: Request, owner: Owner, body: EmbeddingRequest, service: Service, deadline: Deadline
) -> JSONResponse:
    """Embeddings of one text or several (OpenAI's embeddings.create)."""
    refuse_fields(body.model_extra, NOT_CARRIED)
    texts = body.input if isinstance(body.input, list) else [body.input]
    if not all(isinstance(text, str) for text in texts):
        raise InputError("input", "token arrays are not served: send the text")
    inp: dict[str, Any] = {"model": body.model, "input": texts}
    if body.dimensions is not None:
        inp["dimensions"] = body.dimensions
    create = JobCreate(kind="embed", input=inp, **deadline)
    return await answer_when_ended(
        request, service, owner, create, PARAMS, lambda job: embeddings_response(job, body)
    )


def embeddings_response(job: Job, body: EmbeddingRequest) -> dict[str, Any]:
    output = job.output or {}
    as_float = body.encoding_format == "float"
    data = [
        {"object": "embedding", "index": i, "embedding": decode(vector) if as_float else vector}
        for i, vector in enumerate(output["embeddings"])
    ]
    return {"object": "list", "data": data, "model": body.model, "usage": output["usage"]}


def decode(vector: str) -> list[float]:
    """A worker's base64 little-endian float32 vector as numbers."""
    values: list[float] = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    return values
