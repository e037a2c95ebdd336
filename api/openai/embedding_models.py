"""The request of `POST /v1/embeddings`, the `embed` job input it becomes (also a batch's
line's, `api.openai.batch_lines`), and its answer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, WithJsonSchema

from api.openai.protocol import OpenAIRequest, OpenAIResponse
from jobs.errors import InputError
from jobs.schemas.base import COUNT_MAX
from jobs.schemas.embed import OneOrMoreTexts

PARAMS: dict[str, str] = {}
"""Job input fields under another name in OpenAI's request (none)."""


TEXTS_SCHEMA = TypeAdapter(OneOrMoreTexts).json_schema()
"""What the `embed` job's `input` takes, published as what this request takes: token
arrays are taken only to be refused by name, and each text is checked by the job input
(`input.N` naming it)."""


class EmbeddingRequest(OpenAIRequest):
    not_carried = {"user": "not carried"}

    input: Annotated[str | list[str] | list[int] | list[list[int]], WithJsonSchema(TEXTS_SCHEMA)]
    """One text or a list of them (not token arrays): at most `limits.embed_max_inputs`
    texts of `limits.embed_max_chars` characters each (the deployment's settings)."""
    model: str = Field(min_length=1, max_length=256)
    """An embed pipeline, its model or one of its aliases (`text-embedding-3-small`...):
    the deployment's configuration says which (`GET /v1/models` lists them)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1, le=COUNT_MAX)
    """Fewer dimensions per vector, where the pipeline's model allows it (its
    `options.truncate_dimensions`, a deployment setting)."""


def job_input(body: EmbeddingRequest) -> dict[str, object]:
    """The `embed` job input of a request; InputError for what it cannot serve."""
    texts = body.input if isinstance(body.input, list) else [body.input]
    if not all(isinstance(text, str) for text in texts):
        raise InputError("input", "token arrays are not served: send the text")
    inp: dict[str, object] = {"model": body.model, "input": texts}
    if body.dimensions is not None:
        inp["dimensions"] = body.dimensions
    return inp


class Embedding(OpenAIResponse):
    object: Literal["embedding"] = "embedding"
    index: int
    """The place of its text in the request's `input`."""
    embedding: list[float] | str
    """The vector: numbers (`float`), or its little-endian float32 bytes in base64
    (`base64`), as the request's `encoding_format` asked."""


class EmbeddingUsage(OpenAIResponse):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(OpenAIResponse):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    """The model as the request named it."""
    usage: EmbeddingUsage
