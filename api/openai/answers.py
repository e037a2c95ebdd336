"""The answers of the OpenAI routes, built from an ended job: the same for a request
answered as it ends and for a line of a batch's output file (`api.batch_answers`, which
takes them as JSON objects: `completion`, `embeddings`, `failure_body`)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from api.error_handlers import ErrorResponse, error_response
from api.openai.completion_models import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionMessage,
    Completion,
    CompletionChoice,
)
from api.openai.embedding_models import Embedding, EmbeddingList
from jobs.errors import InputError
from jobs.models import Job

JsonObject = dict[str, object]


def page(data: Sequence[Mapping[str, object]], has_more: bool) -> JsonObject:
    """OpenAI's list object of one page of objects that are JSON already (files)."""
    return {
        "object": "list",
        "data": list(data),
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def completion_id(job_id: str, *, chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + job_id


def chat_completion(job: Job, model: str) -> ChatCompletion:
    """A succeeded `llm` job as OpenAI's `chat.completion`, with every choice it made."""
    output = job.output or {}
    return ChatCompletion(
        id=completion_id(job.id, chat=True),
        created=int(job.created_at),
        model=model,
        choices=[chat_choice(out) for out in choices_of(output)],
        usage=output.get("usage"),
    )


def text_completion(job: Job, model: str) -> Completion:
    """A succeeded `llm` job as OpenAI's `text_completion`, with every choice it made."""
    output = job.output or {}
    return Completion(
        id=completion_id(job.id, chat=False),
        created=int(job.created_at),
        model=model,
        choices=[text_choice(out) for out in choices_of(output)],
        usage=output.get("usage"),
    )


def completion(job: Job, model: str, *, chat: bool) -> JsonObject:
    """`chat_completion` or `text_completion` as a JSON object."""
    answer = chat_completion(job, model) if chat else text_completion(job, model)
    return answer.model_dump(mode="json")


def choices_of(output: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An `llm` job output's choices: `choices` when it made several, else the one at its
    top level."""
    several = output.get("choices")
    return list(several) if several else [{"index": 0, **output}]


def chat_choice(out: Mapping[str, Any]) -> ChatChoice:
    """One choice of an `llm` job's output as a chat completion's."""
    text, calls = str(out.get("text", "")), out.get("tool_calls")
    message = ChatCompletionMessage(
        content=text if text or not calls else None, tool_calls=calls or None
    )
    return ChatChoice(
        index=out.get("index", 0),
        message=message,
        finish_reason=out.get("finish_reason"),
        logprobs=out.get("logprobs"),
    )


def text_choice(out: Mapping[str, Any]) -> CompletionChoice:
    """One choice of an `llm` job's output as a text completion's."""
    return CompletionChoice(
        index=out.get("index", 0),
        text=str(out.get("text", "")),
        finish_reason=out.get("finish_reason"),
        logprobs=out.get("logprobs"),
    )


def embedding_list(job: Job, model: str, encoding_format: str) -> EmbeddingList:
    """A succeeded `embed` job as OpenAI's embeddings list (`float` or `base64`)."""
    output = job.output or {}
    as_float = encoding_format == "float"
    data = [
        Embedding(index=i, embedding=decode(vector) if as_float else vector)
        for i, vector in enumerate(output["embeddings"])
    ]
    return EmbeddingList(data=data, model=model, usage=output["usage"])


def embeddings(job: Job, model: str, encoding_format: str) -> JsonObject:
    """`embedding_list` as a JSON object."""
    return embedding_list(job, model, encoding_format).model_dump(mode="json")


def decode(vector: str) -> list[float]:
    """A worker's base64 little-endian float32 vector as numbers."""
    values: list[float] = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    return values


def failure(
    status: str, error: Mapping[str, object] | None, params: Mapping[str, str]
) -> ErrorResponse:
    """A job that did not succeed, as OpenAI's error (a field a worker named is renamed
    as the request names it: `params`)."""
    if status == "canceled":
        return error_response("canceled", "the job was canceled")
    if status == "expired":
        return error_response("expired", "the request's deadline passed before a worker took it")
    error = error or {}
    if error.get("type") == "invalid_input":
        # A field a worker named is the job input's own (`audio`, `input.0`), not the body's.
        field = str(error.get("field") or "input")
        reason = str(error.get("message", "")).removeprefix(f"{field}: ")
        exc = InputError(params.get(field, field), reason)
        return error_response(exc.code, exc.message, exc.field)
    etype, message = str(error.get("type", "error")), str(error.get("message", "the job failed"))
    return error_response(etype, message)


def failure_body(
    status: str, error: Mapping[str, object] | None, params: Mapping[str, str]
) -> JsonObject:
    """`failure` as a JSON object."""
    return failure(status, error, params).model_dump()


def failure_status(status: str, error: Mapping[str, object] | None) -> int:
    if status == "canceled":
        return 409
    if status == "expired":
        return 408
    return 422 if (error or {}).get("type") == "invalid_input" else 500
