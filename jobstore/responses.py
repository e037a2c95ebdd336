"""Stored responses of OpenAI's Responses API (`/v1/responses`, issue 53).

A response is an `llm` job; what the job record does not hold is kept here, one JSON
string per response (`keys.response`): its owner, the request as the client sent it (less
its input), this turn's input items, and the conversation it continues (the chat turns
read from `previous_response_id`'s record and job, so that a chain of responses is read
one record back, never walked). The record is written before its job is submitted, so a
response whose job exists always has it; it lives `job_ttl_s` past the longest its job
may wait and run, and a response is read only with its job (`api.openai.responses`).
"""

from __future__ import annotations

from typing import Any, TypedDict

import orjson
import redis.asyncio as aredis

from jobs import keys
from jobs.settings import MAX_QUEUE_S

RUN_MAX_S = 86_400
"""Room for the job's run in the record's TTL, past its wait in the queue."""


class ResponseRecord(TypedDict):
    owner: str
    request: dict[str, Any]
    """The request's own fields as sent (`model`, `instructions`, `tools`, `metadata`...),
    without `input`."""
    input_items: list[dict[str, Any]]
    """This turn's input items, each with its id."""
    history: list[dict[str, Any]]
    """The chat turns before this one's input: the earlier responses' input and output."""
    created_at: float


class AsyncResponses:
    """The API's stored responses."""

    def __init__(self, client: aredis.Redis, job_ttl_s: int) -> None:
        self.r = client
        self.ttl_s = job_ttl_s + int(MAX_QUEUE_S) + RUN_MAX_S

    async def save(self, job_id: str, record: ResponseRecord) -> None:
        await self.r.set(keys.response(job_id), orjson.dumps(record), ex=self.ttl_s)

    async def get(self, owner: str, job_id: str) -> ResponseRecord | None:
        """The record of `owner`'s response; None where there is none (or it is another
        owner's)."""
        raw = await self.r.get(keys.response(job_id))
        if raw is None:
            return None
        record: ResponseRecord = orjson.loads(raw)
        return record if record["owner"] == owner else None

    async def delete(self, owner: str, job_id: str) -> bool:
        """Forget `owner`'s response; False where there was none of theirs."""
        if await self.get(owner, job_id) is None:
            return False
        return bool(await self.r.delete(keys.response(job_id)))
