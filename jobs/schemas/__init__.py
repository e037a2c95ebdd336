"""Input schemas of the job kinds, and the lookup the API validates with."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from jobs.errors import InputError
from jobs.schemas.asr import AsrInput
from jobs.schemas.base import JobInput
from jobs.schemas.image import ImageInput
from jobs.schemas.llm import LlmInput
from jobs.schemas.tts import TtsInput
from jobs.settings import Settings

BUILTIN_SCHEMAS: dict[str, type[JobInput]] = {
    "asr": AsrInput,
    "tts": TtsInput,
    "image": ImageInput,
    "llm": LlmInput,
}

__all__ = [
    "BUILTIN_SCHEMAS",
    "AsrInput",
    "ImageInput",
    "JobInput",
    "LlmInput",
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
