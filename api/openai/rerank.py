"""`POST /v1/rerank` (Jina's shape, as vLLM serves it) and `POST /v2/rerank` (Cohere's
v2): a `rerank` job, answered when it ends.

`documents` are strings or `{"text": ...}` objects; the answer lists them from the most
relevant to the least (`top_n` of them), each with its `index` in the request, its
`relevance_score` and, unless `return_documents` is false, its `document`. The job is
batched with other requests' pairs by the worker.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.auth import Owner
from api.deps import Service
from api.openai.common import Deadline, answer_when_ended
from api.openai.protocol import responses
from api.openai.rerank_models import PARAMS, RerankRequest, RerankResponse, rerank_response
from jobs.models import JobCreate

router = APIRouter(tags=["openai"])
ERRORS = responses(401, 408, 409, 413, 422, 429, 500, 503)


async def _rerank(
    request: Request, owner: str, body: RerankRequest, service: Service, deadline: Deadline
) -> Response:
    create = JobCreate(kind="rerank", input=body.job_input(), **deadline)
    return await answer_when_ended(
        request, service, owner, create, PARAMS, lambda job: rerank_response(job, body.model)
    )


@router.post("/v1/rerank", response_model=RerankResponse, responses=ERRORS)
async def rerank(
    request: Request, owner: Owner, body: RerankRequest, service: Service, deadline: Deadline
) -> Response:
    """The documents ordered by their relevance to the query (Jina's and vLLM's rerank)."""
    return await _rerank(request, owner, body, service, deadline)


@router.post("/v2/rerank", response_model=RerankResponse, responses=ERRORS)
async def rerank_v2(
    request: Request, owner: Owner, body: RerankRequest, service: Service, deadline: Deadline
) -> Response:
    """The same as `POST /v1/rerank`, at Cohere's v2 path."""
    return await _rerank(request, owner, body, service, deadline)
