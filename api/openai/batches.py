"""OpenAI's Batch API: `POST /v1/batches`, `GET /v1/batches[/{id}]`,
`POST /v1/batches/{id}/cancel`, as the official client calls them.

The input file is an OpenAI file object of purpose `batch` (`client.files.create`); the
output and error files are file objects too, read with `client.files.content`. The
lines run as jobs of priority `batch`, released by the release stage when their
pipeline has room (`cluster/release.py`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.apikeys import Caller
from api.auth import CurrentCaller, Owner
from api.deps import Batches
from api.openai import answers
from jobs.errors import Forbidden
from jobs.models import WebhookSpec
from jobstore.batches import ENDPOINTS, WINDOW

router = APIRouter(prefix="/v1/batches", tags=["openai"])


class BatchCreate(BaseModel):
    # `endpoint` and `completion_window` publish what `BatchService.create` checks, with
    # messages of its own.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    input_file_id: str = Field(min_length=1, max_length=64)
    """An OpenAI file object of yours, of purpose `batch`."""
    endpoint: str = Field(min_length=1, max_length=64, json_schema_extra={"enum": list(ENDPOINTS)})
    """`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, or mmq's `/v1/jobs`."""
    completion_window: str = Field(
        default="24h", max_length=8, json_schema_extra={"pattern": f"^{WINDOW}$"}
    )
    """`24h`; mmq also takes shorter windows (`90s`, `30m`, `2h`), up to 24 hours."""
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    webhook: WebhookSpec | None = None
    """mmq's extension: called once when the batch ends (`batch.completed`, ...), signed
    as a job's webhooks are."""


@router.post("", responses={404: {}, 422: {}})
async def create_batch(owner: Owner, body: BatchCreate, batches: Batches) -> dict[str, Any]:
    """Create a batch (OpenAI's batches.create): every line is checked now; the bad ones
    go to its error file, the rest run as jobs of priority `batch`."""
    batch = await batches.create(
        owner,
        body.input_file_id,
        body.endpoint,
        body.completion_window,
        body.metadata,
        body.webhook,
    )
    return batch.openai()


@router.get("", responses={401: {}, 403: {}})
async def list_batches(
    caller: CurrentCaller,
    batches: Batches,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
    owner: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """Your batches, newest first (OpenAI's batches.list). An admin key sees every
    owner's (each with its `owner`), or one owner's with `?owner=`."""
    if caller.admin:
        found, more = await batches.page(owner, limit, after)
        return answers.page([batch.openai() | {"owner": batch.owner} for batch in found], more)
    if owner is not None and owner != caller.owner:
        raise Forbidden("only an admin key lists another owner's batches")
    found, more = await batches.page(caller.owner, limit, after)
    return answers.page([batch.openai() for batch in found], more)


@router.get("/{batch_id}", responses={404: {}})
async def retrieve_batch(caller: CurrentCaller, batch_id: str, batches: Batches) -> dict[str, Any]:
    """One batch, with its `request_counts` (OpenAI's batches.retrieve); an admin's key
    may name any owner's."""
    return (await batches.get(_whose(caller), batch_id)).openai()


@router.post("/{batch_id}/cancel", responses={404: {}, 409: {}})
async def cancel_batch(caller: CurrentCaller, batch_id: str, batches: Batches) -> dict[str, Any]:
    """Stop releasing its lines: the running ones end, what finished is written out, and
    it ends `cancelled` (OpenAI's batches.cancel); an admin's key may name any owner's."""
    return (await batches.cancel(_whose(caller), batch_id)).openai()


def _whose(caller: Caller) -> str | None:
    """Whose batches the caller may name: its own, or (an admin) anyone's."""
    return None if caller.admin else caller.owner
