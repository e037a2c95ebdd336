"""The request and answers of OpenAI's Batch API (`api.openai.batches`), and the file
objects its input and output files are (`/v1/files`)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from api.openai.protocol import OpenAIRequest, OpenAIResponse, omitted
from jobs.models import WebhookSpec
from jobstore.batch_records import ENDPOINTS, WINDOW, BatchStatus


class BatchCreate(OpenAIRequest):
    # `endpoint` and `completion_window` publish what `BatchService.create` checks, with
    # messages of its own.

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


@with_config(ConfigDict(extra="allow"))
class BatchError(TypedDict, total=False):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchRequestCounts(OpenAIResponse):
    total: int
    completed: int
    failed: int


class Batch(OpenAIResponse):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    """Why the batch failed as a whole (its file unreadable, no valid line)."""
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    metadata: dict[str, str] | None
    owner: str | None = omitted()
    """mmq's: whose batch it is, in an admin key's list."""


class BatchList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[Batch]
    has_more: bool
    first_id: str | None
    last_id: str | None

    @classmethod
    def of(cls, data: list[Batch], has_more: bool) -> BatchList:
        first, last = (data[0].id, data[-1].id) if data else (None, None)
        return cls(data=data, has_more=has_more, first_id=first, last_id=last)


class OpenAIFile(OpenAIResponse):
    """An OpenAI file object, with mmq's storage `key` beside it."""

    id: str
    """`file-…`"""
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    key: str
    """mmq's name of the stored file (a job's input may name it)."""


class UploadedFile(OpenAIFile):
    """`POST /v1/files` with a `purpose`: the file object and the stored file's facts."""

    content_type: str
    sha256: str | None
    url: str
    """A download URL that needs no API key, valid for `storage.url_ttl_s`."""


class FileList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[OpenAIFile]
    has_more: bool
    first_id: str | None
    last_id: str | None


class FileDeleted(OpenAIResponse):
    id: str
    object: Literal["file"] = "file"
    deleted: bool
