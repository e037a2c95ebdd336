"""What the models of every OpenAI-compatible route share (vLLM's
`vllm/entrypoints/openai/protocol.py`): the base of the requests, which holds the rule
for the fields a request does not carry (defined in `jobs.schemas.requests`, since the
`llm` job's input is OpenAI's chat body, and re-exported here); the base of the answers;
and how a route declares its answers in the OpenAPI document.

```
OpenAIBaseModel      a request, or a part of one: an unknown field is kept aside to be refused
 └── OpenAIRequest   a whole request: refused as it is validated (422 naming the field)
OpenAIResponse       an answer, or a part of one
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaValue, models_json_schema

from api.error_handlers import ErrorResponse
from jobs.schemas.requests import CLOSED, UNKNOWN, OpenAIBaseModel, OpenAIRequest

REF_TEMPLATE = "#/components/schemas/{model}"

__all__ = ["CLOSED", "UNKNOWN", "OpenAIBaseModel", "OpenAIRequest"]


def _absent(value: object) -> bool:
    return value is None


def omitted() -> Any:
    """The default of an answer's field that is left out of the JSON, not written as
    null, when it is None (a chunk's `usage`, a delta's `role`)."""
    return Field(default=None, exclude_if=_absent)


class OpenAIResponse(BaseModel):
    """An answer of an OpenAI route, or a part of one."""

    model_config = ConfigDict(use_attribute_docstrings=True)


def json_answer(answer: BaseModel, headers: Mapping[str, str] | None = None) -> Response:
    """`answer` as the JSON body of a 200, written as FastAPI writes a route's model."""
    return JSONResponse(answer.model_dump(mode="json"), headers=dict(headers or {}))


def sse(event: BaseModel) -> bytes:
    """One server-sent event whose data is `event`."""
    return b"data: " + event.__pydantic_serializer__.to_json(event) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keep-alive\n\n"

ERRORS = {
    401: "No API key, or one that is not known.",
    403: "The key may not do this (an admin's may).",
    404: "Not found for this key.",
    408: "The job's deadline passed before a worker took it.",
    409: "The job (or batch) was canceled, or cannot change as asked.",
    413: "The body or its file is over its size limit.",
    422: "A field breaks a rule, or is one the request does not carry: `param` names it.",
    429: "Over the queue's limit or the key's quota: retry after `Retry-After` seconds.",
    500: "The job failed.",
    503: "Redis is unavailable (a failover may be under way): retry.",
}


Responses = dict[int | str, dict[str, Any]]
"""What a route's `responses=` takes (FastAPI's type)."""


def responses(*errors: int, ok: Mapping[str, object] | None = None) -> Responses:
    """`responses=` of a route: what its 200 adds to its response model (`ok`: more
    content types), and OpenAI's error body for each code of `errors`."""
    declared: Responses = {
        code: {"model": ErrorResponse, "description": ERRORS[code]} for code in errors
    }
    return {200: dict(ok), **declared} if ok is not None else declared


def event_stream(
    *events: type[BaseModel], done: bool = False
) -> dict[str, dict[str, JsonSchemaValue]]:
    """The `text/event-stream` content of a 200 whose events' data are one of `events`
    (and `[DONE]` at the end where `done`). The models' schemas are in its `$defs`, which
    join the document's components when it is made (`api.openapi`)."""
    refs, defs = models_json_schema(
        [(model, "serialization") for model in events], ref_template=REF_TEMPLATE
    )
    options = [refs[(model, "serialization")] for model in events]
    schema: JsonSchemaValue = {"oneOf": options} if len(options) > 1 else dict(options[0])
    schema["description"] = "Each event's data" + ("; the last one's is `[DONE]`." if done else ".")
    return {"text/event-stream": {"schema": schema | defs}}


class ModelCard(OpenAIResponse):
    """A model the deployment serves: a pipeline, its model, an alias or a LoRA adapter."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "mmq"
    kind: str
    """mmq's: the kind of job that serves it (`llm`, `image`, `asr`, `tts`, `embed`...)."""
    pipeline: str
    """mmq's: the pipeline that serves it."""
    parent: str | None = omitted()
    """A LoRA adapter's base model (as vLLM lists one)."""
    model: str | None = omitted()
    """mmq's: the model its pipeline runs, by the name clients may use (a hub id, the
    packaged LLM's name); omitted for a model loaded from a path. The same on the cards of
    a pipeline's name and aliases, so that a list can say which names are one model."""


class ModelList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[ModelCard]
