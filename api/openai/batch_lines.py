"""One line of a batch's input file, checked as the route it names would check it: the
job it becomes (`JobCreate`) and what its answer's shape needs, or `InputError` naming
the field (`body.messages.0.content`, `custom_id`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from api.openai.chat_models import ChatRequest, CompletionRequest
from api.openai.embedding_models import EmbeddingRequest
from api.openai.embedding_models import job_input as embed_input
from jobs.errors import InputError
from jobs.models import JobCreate
from jobs.schemas import validation_error_field

Answer = dict[str, str]
"""What a line's answer needs beyond its job (the request's `model`, an embedding's
`encoding_format`)."""
Parsed = tuple[str, JobCreate, Answer]
"""custom_id, the job, what the answer needs."""
Body = dict[str, object]
"""A line's `body`: a JSON object."""


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], body: Body) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error_field(exc, "body") from None
    except InputError as exc:  # a field the request does not carry (`OpenAIRequest`)
        raise _renamed(exc) from None


def _renamed(exc: InputError) -> InputError:
    field = exc.field.removeprefix("input.").removeprefix("body.")
    return type(exc)(f"body.{field}", exc.reason)


def _completion(body: Body, *, chat: bool) -> tuple[JobCreate, Answer]:
    request: ChatRequest | CompletionRequest = (
        _validated(ChatRequest, body) if chat else _validated(CompletionRequest, body)
    )
    if request.stream:
        raise InputError("body.stream", "a batch's requests are not streamed")
    return JobCreate(kind="llm", input=request.job_input()), {"model": request.model}


def _chat(body: Body) -> tuple[JobCreate, Answer]:
    return _completion(body, chat=True)


def _text(body: Body) -> tuple[JobCreate, Answer]:
    return _completion(body, chat=False)


def _embeddings(body: Body) -> tuple[JobCreate, Answer]:
    request = _validated(EmbeddingRequest, body)
    try:
        inp = embed_input(request)
    except InputError as exc:
        raise _renamed(exc) from None
    answer = {"model": request.model, "encoding_format": request.encoding_format}
    return JobCreate(kind="embed", input=inp), answer


def _job(body: Body) -> tuple[JobCreate, Answer]:
    create = _validated(JobCreate, body)
    if create.webhook is not None:
        raise InputError("body.webhook", "a batch's lines take no webhook: the batch has one")
    return create, {}


PARSERS: dict[str, Callable[[Body], tuple[JobCreate, Answer]]] = {
    "/v1/chat/completions": _chat,
    "/v1/completions": _text,
    "/v1/embeddings": _embeddings,
    "/v1/jobs": _job,
}


def parse_line(raw: bytes, endpoint: str) -> Parsed:
    """A line of the input file as (custom_id, job, answer); `InputError` naming the
    field at fault."""
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError("line", f"is not JSON ({exc})") from None
    if not isinstance(request, dict):
        raise InputError("line", "must be a JSON object")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        raise InputError("custom_id", "must be a string of 1 to 512 characters")
    if request.get("method", "POST") != "POST":
        raise InputError("method", "must be POST")
    if request.get("url") != endpoint:
        raise InputError("url", f"must be the batch's endpoint, {endpoint}")
    if not isinstance(request.get("body"), dict):
        raise InputError("body", "must be a JSON object")
    create, answer = PARSERS[endpoint](request["body"])
    return custom_id, create, answer


def body_field(endpoint: str, field: str) -> str:
    """A field of a line's job, as the line names it: `body.input.text` for `/v1/jobs`,
    `body.max_tokens` for an OpenAI request (whose fields the job input takes)."""
    return "body." + (field if endpoint == "/v1/jobs" else field.removeprefix("input."))


def custom_id_of(raw: bytes) -> str | None:
    """The line's `custom_id` where one can be read (for the error file's line)."""
    try:
        value = orjson.loads(raw).get("custom_id")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def bounded_lines(chunks: Iterable[bytes], max_bytes: int) -> Iterator[bytes | int]:
    """The non-blank lines of a file read in chunks; a line over `max_bytes` comes as its
    size instead, and is never held whole (issue 65: one 100 MB line held the API)."""
    pending = bytearray()
    over = 0  # the bytes of a line too long, skipped as they come
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if over:
                over += len(piece)
            elif len(pending) + len(piece) > max_bytes:
                over = len(pending) + len(piece)
                pending.clear()
            else:
                pending += piece
            if end < 0:
                break
            if over or pending.strip():
                yield over or bytes(pending)
            pending.clear()
            over = 0
            start = end + 1
    if over or pending.strip():
        yield over or bytes(pending)
