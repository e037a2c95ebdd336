"""Input schemas of the job kinds, and the lookup the API validates with; the options
model of each built-in kind's pipelines."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ValidationError

from jobs.errors import InputError
from jobs.schemas.asr import AsrInput, AsrOptions
from jobs.schemas.base import JobInput
from jobs.schemas.embed import EmbedInput, EmbedOptions
from jobs.schemas.image import ImageInput, ImageOptions
from jobs.schemas.llm import LlmInput
from jobs.schemas.llm_options import LlmOptions
from jobs.schemas.rerank import RerankInput, RerankOptions
from jobs.schemas.tts import TtsInput, TtsOptions
from jobs.settings import Settings

BUILTIN_SCHEMAS: dict[str, type[JobInput]] = {
    "asr": AsrInput,
    "tts": TtsInput,
    "image": ImageInput,
    "llm": LlmInput,
    "embed": EmbedInput,
    "rerank": RerankInput,
}

OPTIONS_MODELS: dict[str, type[BaseModel]] = {
    "asr": AsrOptions,
    "tts": TtsOptions,
    "image": ImageOptions,
    "llm": LlmOptions,
    "embed": EmbedOptions,
    "rerank": RerankOptions,
}
"""The `[pipelines.NAME.options]` model of each built-in kind (a kind of the user's own
has untyped options)."""

__all__ = [
    "BUILTIN_SCHEMAS",
    "OPTIONS_MODELS",
    "AsrInput",
    "EmbedInput",
    "ImageInput",
    "JobInput",
    "LlmInput",
    "RerankInput",
    "TtsInput",
    "import_object",
    "schema_for",
]


def import_object(path: str) -> Any:
    """Import `module:attr`."""
    module_name, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"{path!r} is not of the form module:attr")
    return getattr(importlib.import_module(module_name), attr)


def schema_for(kind: str, settings: Settings) -> type[JobInput]:
    """The input model of `kind`: a built-in one or one from `[kinds]` in settings."""
    if kind in settings.kinds:
        schema = import_object(settings.kinds[kind].schema_)
        if not (isinstance(schema, type) and issubclass(schema, JobInput)):
            raise TypeError(f"schema of kind {kind!r} is not a JobInput subclass")
        return schema
    if kind in BUILTIN_SCHEMAS:
        return BUILTIN_SCHEMAS[kind]
    raise KeyError(kind)


def validation_error_field(exc: ValidationError, prefix: str) -> InputError:
    """The first error of a pydantic ValidationError as an InputError naming the field."""
    first = exc.errors()[0]
    loc = ".".join(str(part) for part in (prefix, *first["loc"]) if part != "")
    return InputError(loc, first["msg"])
