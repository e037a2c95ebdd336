"""OpenAI's Batch API: `POST /v1/batches`, `GET /v1/batches[/{id}]`,
`POST /v1/batches/{id}/cancel`, as the official client calls them.

The input file is an OpenAI file object of purpose `batch` (`client.files.create`); the
output and error files are file objects too, read with `client.files.content`. The
lines run as jobs of priority `batch`, released by the scheduler when their pipeline has
room (`scheduler.batch_feed`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.auth import CurrentCaller, Owner
from api.callers import Caller
from api.deps import Batches
from api.openai.batch_models import Batch, BatchCreate, BatchList
from api.openai.protocol import responses
from jobs.errors import Forbidden
from jobstore.batch_records import Batch as BatchRecord

router = APIRouter(prefix="/v1/batches", tags=["openai"])


def batch_object(batch: BatchRecord, *, owner: bool = False) -> Batch:
    """OpenAI's batch object of a batch (with its `owner`, in an admin's list)."""
    answer = Batch.model_validate(batch.openai())
    if owner:
        answer.owner = batch.owner
    return answer


@router.post("", responses=responses(401, 404, 413, 422, 503))
async def create_batch(owner: Owner, body: BatchCreate, batches: Batches) -> Batch:
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
    return batch_object(batch)


@router.get("", responses=responses(401, 403, 422, 503))
async def list_batches(
    caller: CurrentCaller,
    batches: Batches,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(max_length=64)] = None,
    owner: Annotated[str | None, Query(max_length=64)] = None,
) -> BatchList:
    """Your batches, newest first (OpenAI's batches.list). An admin key sees every
    owner's (each with its `owner`), or one owner's with `?owner=`."""
    if caller.admin:
        found, more = await batches.page(owner, limit, after)
        return BatchList.of([batch_object(batch, owner=True) for batch in found], more)
    if owner is not None and owner != caller.owner:
        raise Forbidden("only an admin key lists another owner's batches")
    found, more = await batches.page(caller.owner, limit, after)
    return BatchList.of([batch_object(batch) for batch in found], more)


@router.get("/{batch_id}", responses=responses(401, 404, 422, 503))
async def retrieve_batch(caller: CurrentCaller, batch_id: str, batches: Batches) -> Batch:
    """One batch, with its `request_counts` (OpenAI's batches.retrieve); an admin's key
    may name any owner's."""
    return batch_object(await batches.get(_whose(caller), batch_id))


@router.post("/{batch_id}/cancel", responses=responses(401, 404, 409, 422, 503))
async def cancel_batch(caller: CurrentCaller, batch_id: str, batches: Batches) -> Batch:
    """Stop releasing its lines: the running ones end, what finished is written out, and
    it ends `cancelled` (OpenAI's batches.cancel); an admin's key may name any owner's."""
    return batch_object(await batches.cancel(_whose(caller), batch_id))


def _whose(caller: Caller) -> str | None:
    """Whose batches the caller may name: its own, or (an admin) anyone's."""
    return None if caller.admin else caller.owner
