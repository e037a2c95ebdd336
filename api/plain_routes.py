"""The hot routes without FastAPI's per-request machinery: `POST /v1/chat/completions`,
`POST /v1/completions` and `POST /v1/jobs` as plain Starlette routes, first in the app's
route table.

`bench.admission` measured, on mmq's app and behind its middleware, FastAPI's dependency
solving, body decoding and validation at about 95 µs per request on the chat route beyond
the same work done by hand (150 against 56 µs), and finding that route among the app's
routers at about 60 µs: together about 8 % of the API's CPU per LLM request
(`bench.llm_ceiling`). Here each route does by hand what its FastAPI route's signature
asks for (the owner, the body validated from its bytes by pydantic's compiled validator in
one call, the headers, the service) and calls the same code (`api.openai.chat.complete`,
`api.routes.jobs.submit`).

The FastAPI routes stay registered under the same paths: they are what the OpenAPI
document describes (the same body models, the same answers), and no request reaches them.
A request these routes refuse is refused as FastAPI would refuse it: the same
`RequestValidationError`, with the same locations (`body...`, `header...`), answered by
the app's own handler.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from api.auth import current_caller, current_owner
from api.deps import get_state
from api.openai.chat import complete
from api.openai.chat_models import ChatRequest, CompletionRequest
from api.openai.common import DeadlineFields, deadline_fields
from api.routes import jobs
from jobs.models import JobCreate
from jobs.settings import MAX_QUEUE_S

Body = TypeVar("Body", bound=BaseModel)
Endpoint = Callable[[Request], Awaitable[Response]]

TIMEOUT_HEADER = "x-request-timeout"
_TIMEOUT: TypeAdapter[float] = TypeAdapter(Annotated[float, Field(gt=0, le=MAX_QUEUE_S)])
"""What `api.openai.common.Deadline` takes from the header (its `Header(gt, le)`)."""


async def body_of(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model`, validated from its bytes in one call; refused
    as FastAPI refuses a body (`RequestValidationError`, locations under `body`)."""
    raw = await request.body()
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if errors and errors[0]["type"] == "json_invalid":
            raise RequestValidationError([_json_error(raw)]) from None
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in errors]
        ) from None


def _json_error(raw: bytes) -> dict[str, Any]:
    """FastAPI's error for a body that is not JSON (its position in the body)."""
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        position, reason = exc.pos, exc.msg
    except UnicodeDecodeError as exc:
        position, reason = exc.start, "not UTF-8"
    else:  # JSON that pydantic's parser refuses (a number out of its range...)
        position, reason = 0, "not JSON that can be validated"
    return {
        "type": "json_invalid",
        "loc": ("body", position),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": reason},
    }


def deadline_of(request: Request) -> DeadlineFields:
    """`X-Request-Timeout` as the job's deadline fields, checked as `Deadline` checks it."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return {}
    try:
        seconds = _TIMEOUT.validate_python(raw)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("header", TIMEOUT_HEADER)} for e in exc.errors(include_url=False)]
        ) from None
    return deadline_fields(seconds)


def completion_route(model: type[ChatRequest] | type[CompletionRequest]) -> Endpoint:
    """The endpoint of chat completions (`ChatRequest`) or text completions."""
    chat = model is ChatRequest

    async def endpoint(request: Request) -> Response:
        caller = await current_caller(request)  # a POST: no usage to read (`current_owner`)
        body = await body_of(request, model)
        service = get_state(request).service
        deadline = deadline_of(request)
        return await complete(
            request, service, caller.owner, body, deadline, chat=chat, key_id=caller.key_id
        )

    return endpoint


def idempotency_key_of(request: Request) -> str | None:
    """`Idempotency-Key`, checked as `api.routes.jobs.IdempotencyKey` checks it."""
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > jobs.IDEMPOTENCY_KEY_MAX:
        limit = jobs.IDEMPOTENCY_KEY_MAX
        too_long = {
            "type": "string_too_long",
            "loc": ("header", "Idempotency-Key"),
            "msg": f"String should have at most {limit} characters",
            "input": key,
            "ctx": {"max_length": limit},
        }
        raise RequestValidationError([too_long])
    return key


async def submit_job(request: Request) -> Response:
    owner = await current_owner(request)
    body = await body_of(request, JobCreate)
    state = get_state(request)
    prefer, key = request.headers.get("prefer"), idempotency_key_of(request)
    return await jobs.submit(owner, body, state.service, state.settings, prefer, key)


ROUTES: list[BaseRoute] = [
    Route("/v1/jobs", submit_job, methods=["POST"]),
    Route("/v1/chat/completions", completion_route(ChatRequest), methods=["POST"]),
    Route("/v1/completions", completion_route(CompletionRequest), methods=["POST"]),
]
"""Put first in the app's table (`create_app`)."""
