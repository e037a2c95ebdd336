"""`POST /v1/embeddings`, OpenAI-compatible: an `embed` job, answered when it ends.

`input` is a string or a list of strings (token arrays are refused by name: send text);
`encoding_format` is `float` (lists of numbers) or `base64` (little-endian float32, what
the official client asks for by default and decodes itself); `dimensions` where the
pipeline allows it. The job is batched with other requests' texts by the worker.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.auth import Owner
from api.deps import Service
from api.openai import answers
from api.openai.common import Deadline, answer_when_ended
from api.openai.embedding_models import PARAMS, EmbeddingRequest, job_input
from jobs.models import Job, JobCreate

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/embeddings", responses={413: {}, 422: {}, 429: {}})
async def create_embeddings(
    request: Request, owner: Owner, body: EmbeddingRequest, service: Service, deadline: Deadline
) -> JSONResponse:
    """Embeddings of one text or several (OpenAI's embeddings.create)."""
    create = JobCreate(kind="embed", input=job_input(body), **deadline)
    return await answer_when_ended(
        request, service, owner, create, PARAMS, lambda job: embeddings_response(job, body)
    )


def embeddings_response(job: Job, body: EmbeddingRequest) -> dict[str, Any]:
    return answers.embeddings(job, body.model, body.encoding_format)
