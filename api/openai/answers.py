"""The bodies of the OpenAI routes' answers, built from an ended job: the same for a
request answered as it ends and for a line of a batch's output file."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from api.errors import error_body
from jobs.errors import InputError
from jobs.models import Job


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object (files, batches) of one page."""
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def completion_id(job_id: str, *, chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + job_id


def completion(job: Job, model: str, *, chat: bool) -> dict[str, Any]:
    """A succeeded `llm` job as OpenAI's `chat.completion` (`chat`) or `text_completion`,
    with every choice the job made."""
    output = job.output or {}
    return {
        "id": completion_id(job.id, chat=chat),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(job.created_at),
        "model": model,
        "choices": [choice(out, chat=chat) for out in choices_of(output)],
        "usage": output.get("usage"),
    }


def choices_of(output: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An `llm` job output's choices: `choices` when it made several, else the one at its
    top level."""
    several = output.get("choices")
    return list(several) if several else [{"index": 0, **output}]


def choice(out: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    """One choice of an `llm` job's output in OpenAI's shape."""
    text, calls = str(out.get("text", "")), out.get("tool_calls")
    if not chat:
        logprobs = out.get("logprobs")
        return {
            "index": out.get("index", 0),
            "text": text,
            "finish_reason": out.get("finish_reason"),
            "logprobs": logprobs,
        }
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return {
        "index": out.get("index", 0),
        "message": message,
        "finish_reason": out.get("finish_reason"),
        "logprobs": out.get("logprobs"),
    }


def embeddings(job: Job, model: str, encoding_format: str) -> dict[str, Any]:
    """A succeeded `embed` job as OpenAI's embeddings list (`float` or `base64`)."""
    output = job.output or {}
    as_float = encoding_format == "float"
    data = [
        {"object": "embedding", "index": i, "embedding": decode(vector) if as_float else vector}
        for i, vector in enumerate(output["embeddings"])
    ]
    return {"object": "list", "data": data, "model": model, "usage": output["usage"]}


def decode(vector: str) -> list[float]:
    """A worker's base64 little-endian float32 vector as numbers."""
    values: list[float] = np.frombuffer(base64.b64decode(vector), dtype="<f4").tolist()
    return values


def failure_body(
    status: str, error: Mapping[str, Any] | None, params: Mapping[str, str]
) -> dict[str, Any]:
    if status == "canceled":
        return error_body("canceled", "the job was canceled")
    if status == "expired":
        return error_body("expired", "the request's deadline passed before a worker took it")
    error = error or {}
    if error.get("type") == "invalid_input":
        # A field a worker named is the job input's own (`audio`, `input.0`), not the body's.
        field = str(error.get("field") or "input")
        reason = str(error.get("message", "")).removeprefix(f"{field}: ")
        exc = InputError(params.get(field, field), reason)
        return error_body(exc.code, exc.message, exc.field)
    return error_body(str(error.get("type", "error")), str(error.get("message", "the job failed")))


def failure_status(status: str, error: Mapping[str, Any] | None) -> int:
    if status == "canceled":
        return 409
    if status == "expired":
        return 408
    return 422 if (error or {}).get("type") == "invalid_input" else 500
