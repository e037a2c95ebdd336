"""Batches (OpenAI's Batch API), as the API and the scheduler share them: the record,
its states, the lines waiting to be released, the OpenAI objects, and the scripts that
move a line along.

A batch is a file of requests to one endpoint. Its valid lines wait in Redis
(`keys.batch_lines`) until the scheduler (`scheduler.batch_feed`) makes each a job of
priority `batch` when its pipeline has room; every line ends as exactly one line of the
output file (it succeeded) or of the error file (it was invalid, or its job did not
succeed).

```
validating ──> in_progress ──> finalizing ──> completed
    │               ├──> cancelling ──> cancelled
    └──> failed     └──> expired (its completion window ended)
```
"""

from __future__ import annotations

import re
import time
from enum import StrEnum
from typing import Any

import orjson
from pydantic import BaseModel, Field, JsonValue

from jobs.models import WebhookSpec
from jobs.wire import BatchError, BatchEvent, OpenAIBatch
from jobstore.codec import dumps


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in ENDED


ENDED = frozenset(
    {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/jobs")
"""What a batch may call: OpenAI's three, and mmq's own job submit (any kind)."""

WINDOW = r"([1-9][0-9]*)([smh])"
"""A completion window: seconds, minutes or hours, up to `MAX_WINDOW_S`."""
_WINDOW = re.compile(WINDOW)
MAX_WINDOW_S = 24 * 3600


def window_seconds(window: str) -> int | None:
    """The seconds of a completion window (`24h`; mmq also takes shorter ones, `90s`,
    `30m`), or None when it is not one."""
    match = _WINDOW.fullmatch(window)
    if match is None:
        return None
    seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
    return seconds if seconds <= MAX_WINDOW_S else None


class Batch(BaseModel):
    """A batch's record (a Redis hash; `fields` / `from_fields`)."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: float
    expires_at: float
    metadata: dict[str, str] = Field(default_factory=dict)
    total: int = 0
    completed: int = 0
    failed: int = 0
    in_progress_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    failed_at: float | None = None
    expired_at: float | None = None
    cancelling_at: float | None = None
    cancelled_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[BatchError] = Field(default_factory=list)
    """Why the batch failed as a whole (the file unreadable, no valid line): OpenAI's
    `errors.data`."""
    webhook: WebhookSpec | None = None
    """Called once when the batch ends (mmq's extension)."""

    def fields(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in self.model_dump(mode="json").items():
            if key in {"metadata", "errors", "webhook"}:
                out[key] = "" if value is None else dumps(value)
            else:
                out[key] = "" if value is None else str(value)
        return out

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Batch:
        data: dict[str, JsonValue] = {}
        for key, value in fields.items():
            if key in {"metadata", "errors", "webhook"}:
                data[key] = orjson.loads(value) if value else None
            else:
                data[key] = value if value != "" else None
        data["metadata"] = data.get("metadata") or {}
        data["errors"] = data.get("errors") or []
        return cls.model_validate(data)

    def openai(self) -> OpenAIBatch:
        """OpenAI's batch object."""
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": str(self.status),
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "expires_at": int(self.expires_at),
            "in_progress_at": _seconds(self.in_progress_at),
            "finalizing_at": _seconds(self.finalizing_at),
            "completed_at": _seconds(self.completed_at),
            "failed_at": _seconds(self.failed_at),
            "expired_at": _seconds(self.expired_at),
            "cancelling_at": _seconds(self.cancelling_at),
            "cancelled_at": _seconds(self.cancelled_at),
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata or None,
        }


def _seconds(stamp: float | None) -> int | None:
    return int(stamp) if stamp is not None else None


class Line(BaseModel):
    """One valid line waiting to be released (JSON in `keys.batch_lines`)."""

    line: int
    """Its line number in the input file (from 1)."""
    custom_id: str
    pipeline: str
    """The pipeline that runs it (its room decides when it is released)."""
    job: dict[str, Any]
    """The `JobCreate` body of its job (`kind`, `input`, `metadata`; validated when the
    batch was created, its input any kind's JSON)."""
    answer: dict[str, str] = Field(default_factory=dict)
    """What the answer's shape needs beyond the job (the request's `model`, an
    embedding's `encoding_format`)."""

    def job_id(self, batch_id: str) -> str:
        """Its job's id, the same however often it is released (a release sent again
        after a crash finds the job made)."""
        return f"job_{batch_id.removeprefix('batch_')}_{self.line}"


def end_event(batch: Batch) -> BatchEvent | None:
    """The event a batch's webhook gets when it ends (`batch.completed`, `batch.failed`,
    `batch.cancelled`, `batch.expired`, as OpenAI names them), or None when its webhook
    does not want it."""
    spec = batch.webhook
    if spec is None or not {"all", "status", "terminal"} & set(spec.events):
        return None
    return {
        "id": f"{batch.id}.{batch.status}",
        "batch_id": batch.id,
        "type": f"batch.{batch.status}",
        "data": batch.openai(),
        "ts": time.time(),
    }


def request_id(batch_id: str, line: int) -> str:
    """The `id` of an output or error line."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


def output_line(
    batch_id: str, line: int, custom_id: str, status_code: int, body: dict[str, Any], job_id: str
) -> str:
    """A line of the output file (status 200) or of the error file (a job that did not
    succeed), in OpenAI's shape; `body` is what the line's endpoint answers (any JSON
    object: an OpenAI answer, a job's view, an error)."""
    response = {"status_code": status_code, "request_id": job_id, "body": body}
    record = {
        "id": request_id(batch_id, line),
        "custom_id": custom_id,
        "response": response,
        "error": None,
    }
    return dumps(record)


def invalid_line(batch_id: str, line: int, custom_id: str | None, code: str, message: str) -> str:
    """A line of the error file for an input line that was never run."""
    record = {
        "id": request_id(batch_id, line),
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message, "line": line},
    }
    return dumps(record)


COLLECT = """
-- KEYS: batch record, in-flight hash, output list, error list
-- ARGV: job id, 'output' or 'errors', the line, the count field (completed or failed)
-- Moves one ended job's line out of the in-flight hash into a file, once.
if redis.call('HDEL', KEYS[2], ARGV[1]) == 0 then return 0 end
if ARGV[2] == 'output' then
  redis.call('RPUSH', KEYS[3], ARGV[3])
else
  redis.call('RPUSH', KEYS[4], ARGV[3])
end
redis.call('HINCRBY', KEYS[1], ARGV[4], 1)
return 1
"""

SET_IF = """
-- KEYS: batch record; ARGV: JSON {sources: [status, ...], fields: {name: value}}
-- Writes the fields only while the batch's status is one of the sources.
local a = cjson.decode(ARGV[1])
local status = redis.call('HGET', KEYS[1], 'status')
local allowed = false
for _, source in ipairs(a.sources) do
  if source == status then allowed = true end
end
if not allowed then return 0 end
for name, value in pairs(a.fields) do redis.call('HSET', KEYS[1], name, value) end
return 1
"""
