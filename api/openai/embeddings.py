"""`POST /v1/embeddings`, OpenAI-compatible: an `embed` job, answered when it ends.

`input` is a string or a list of strings (token arrays are refused by name: send text);
`encoding_format` is `float` (lists of numbers) or `base64` (little-endian float32, what
the official client asks for by default and decodes itself); `dimensions` where the
pipeline allows it. The job is batched with other requests' texts by the worker.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.auth import Owner
from api.deps import Service
from api.openai import answers
from api.openai.common import Deadline, answer_when_ended
from api.openai.embedding_models import PARAMS, EmbeddingList, EmbeddingRequest, job_input
from api.openai.protocol import responses
from jobs.models import Job, JobCreate

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post(
    "/embeddings",
    response_model=EmbeddingList,
    responses=responses(401, 408, 409, 413, 422, 429, 500, 503),
)
async def create_embeddings(
    request: Request, owner: Owner, body: EmbeddingRequest, service: Service, deadline: Deadline
) -> Response:
    """Embeddings of one text or several (OpenAI's embeddings.create)."""
    create = JobCreate(kind="embed", input=job_input(body), **deadline)
    return await answer_when_ended(
        request, service, owner, create, PARAMS, lambda job: embeddings_response(job, body)
    )


def embeddings_response(job: Job, body: EmbeddingRequest) -> EmbeddingList:
    return answers.embedding_list(job, body.model, body.encoding_format)
