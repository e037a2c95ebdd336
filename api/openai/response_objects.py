"""The objects of OpenAI's Responses API that mmq answers: a response, its output items
and its usage, made from a stored response's record and its `llm` job.

Ids come from the job's: the response `resp_X` is the job `job_X`, its message `msg_X`
and its i-th function call `fc_X_i`, so that the same job always gives the same ids (a
stream resumed after a restart, an object read twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict

from api.openai import answers
from api.openai.protocol import OpenAIResponse, omitted
from jobs.models import Job
from jobs.states import JobStatus
from jobstore.responses import ResponseRecord

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled", "incomplete"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]

RESPONSE_PREFIX, JOB_PREFIX = "resp_", "job_"

STATUSES: dict[JobStatus, ResponseStatus] = {
    JobStatus.QUEUED: "queued",
    JobStatus.RUNNING: "in_progress",
    JobStatus.SUCCEEDED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.EXPIRED: "failed",
    JobStatus.CANCELED: "cancelled",
}


def response_id(job_id: str) -> str:
    return RESPONSE_PREFIX + job_id.removeprefix(JOB_PREFIX)


def job_id_of(response_id: str) -> str | None:
    """The job of a response id; None for an id that is not a response's."""
    if not response_id.startswith(RESPONSE_PREFIX):
        return None
    return JOB_PREFIX + response_id.removeprefix(RESPONSE_PREFIX)


def message_id(job_id: str) -> str:
    return "msg_" + job_id.removeprefix(JOB_PREFIX)


def call_item_id(job_id: str, index: int) -> str:
    return f"fc_{job_id.removeprefix(JOB_PREFIX)}_{index}"


class OutputText(OpenAIResponse):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class MessageItem(OpenAIResponse):
    type: Literal["message"] = "message"
    id: str
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(OpenAIResponse):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(OpenAIResponse):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(OpenAIResponse):
    reasoning_tokens: int = 0


class ResponseUsage(OpenAIResponse):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


ErrorCode = Literal["server_error", "invalid_prompt"]


class ResponseError(OpenAIResponse):
    code: ErrorCode
    message: str


class IncompleteDetails(OpenAIResponse):
    reason: Literal["max_output_tokens", "content_filter"]


class Response(OpenAIResponse):
    """OpenAI's response object."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: ResponseStatus
    background: bool
    completed_at: float | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] = {}
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    service_tier: str = "default"
    store: bool
    temperature: float = 1.0
    text: dict[str, Any]
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float = 1.0
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    job_id: str | None = omitted()
    """mmq's: the job that answers it (`GET /v1/jobs/{id}`, its events, its webhook)."""


EventType = Literal[
    "response.created", "response.queued", "response.in_progress",
    "response.output_item.added", "response.output_item.done",
    "response.content_part.added", "response.content_part.done",
    "response.output_text.delta", "response.output_text.done",
    "response.function_call_arguments.delta", "response.function_call_arguments.done",
    "response.completed", "response.incomplete", "response.failed",
]  # fmt: skip


class StreamEvent(OpenAIResponse):
    """One event of a response's stream, as OpenAI's `ResponseStreamEvent` of its `type`
    (`api.openai.response_stream` says which come when): `response` (the response as it
    stands) on the `response.*` events; `item` and `output_index` on `output_item.*`;
    `item_id`, `output_index`, `content_index` and `delta`, `text` or `part` on the
    content's; `arguments` and `name` on `function_call_arguments.done`."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    type: EventType
    sequence_number: int
    """From 0, one per event of the response: `starting_after` resumes after one."""


def output_items(job_id: str, output: Mapping[str, Any], status: ItemStatus) -> list[OutputItem]:
    """An `llm` job's output (its first choice) as output items: its text as a message,
    then each tool call as a function call."""
    out = answers.choices_of(output)[0]
    items: list[OutputItem] = []
    text, calls = str(out.get("text") or ""), out.get("tool_calls") or []
    if text or not calls:
        part = OutputText(text=text)
        items.append(MessageItem(id=message_id(job_id), status=status, content=[part]))
    for i, call in enumerate(calls):
        function = call["function"]
        items.append(
            FunctionCallItem(
                id=call_item_id(job_id, i), call_id=call["id"], name=function["name"],
                arguments=function["arguments"], status="completed",
            )
        )  # fmt: skip
    return items


def usage_of(output: Mapping[str, Any]) -> ResponseUsage | None:
    usage = output.get("usage")
    if not usage:
        return None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ResponseUsage(
        input_tokens=usage["prompt_tokens"],
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=usage["completion_tokens"],
        total_tokens=usage["total_tokens"],
    )


def finished_status(output: Mapping[str, Any]) -> ResponseStatus:
    """`incomplete` for an answer cut at `max_output_tokens`, else `completed`."""
    return (
        "incomplete"
        if answers.choices_of(output)[0].get("finish_reason") == "length"
        else "completed"
    )


def turns_of(output: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A job's answer as the chat turn a later response reads (`previous_response_id`)."""
    out = answers.choices_of(output)[0]
    turn: dict[str, Any] = {"role": "assistant", "content": str(out.get("text") or "") or None}
    if out.get("tool_calls"):
        turn["tool_calls"] = list(out["tool_calls"])
    elif turn["content"] is None:
        turn["content"] = ""
    return [turn]


def response_object(
    job: Job, record: ResponseRecord, status: ResponseStatus | None = None
) -> Response:
    """The response of `job` as it stands (`status`: as a stream's event has it, where it
    is ahead of the job read)."""
    request = record["request"]
    state = status or STATUSES[job.status]
    output = job.output if job.status is JobStatus.SUCCEEDED and status is None else None
    if output is not None:
        state = finished_status(output)
    error = None
    if state == "failed":
        message = job.error.message if job.error is not None else f"the job {job.status}"
        bad_input = job.error is not None and job.error.type == "invalid_input"
        code: ErrorCode = "invalid_prompt" if bad_input else "server_error"
        error = ResponseError(code=code, message=message)
    return Response(
        id=response_id(job.id),
        created_at=job.created_at,
        status=state,
        background=bool(request.get("background")),
        completed_at=job.finished_at if output is not None else None,
        error=error,
        incomplete_details=IncompleteDetails(reason="max_output_tokens")
        if state == "incomplete"
        else None,
        instructions=request.get("instructions"),
        max_output_tokens=request.get("max_output_tokens"),
        metadata=request.get("metadata") or {},
        model=request["model"],
        output=[] if output is None else output_items(job.id, output, "completed"),
        parallel_tool_calls=request.get("parallel_tool_calls") is not False,
        previous_response_id=request.get("previous_response_id"),
        service_tier=request.get("service_tier") or "default",
        store=request.get("store", True),
        temperature=_given(request.get("temperature"), 1.0),
        text=request.get("text") or {"format": {"type": "text"}},
        tool_choice=request.get("tool_choice") or "auto",
        tools=request.get("tools") or [],
        top_p=_given(request.get("top_p"), 1.0),
        usage=None if output is None else usage_of(output),
        job_id=job.id,
    )


def _given(value: float | None, default: float) -> float:
    return default if value is None else value
