"""Which fields of a job input name a file: a stored key, an http(s) URL or an s3:// URL.

A schema marks such a field with the `FileRef` type; the API checks every marked field
at submit (the owner's key exists, the URL passes the SSRF guard, an s3:// URL names the
configured bucket), and workers resolve it with `storage.fetch`.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, Field

from jobs.schemas import AsrInput, ImageInput, TtsInput


class FileRefMarker:
    """Metadata that marks a `str` field of a job input as a file reference."""

    def __repr__(self) -> str:
        return "FileRef"


FILE_REF = FileRefMarker()

FileRef = Annotated[str, FILE_REF, Field(min_length=1, max_length=4096)]
"""A stored file key (`OWNER/uploads/...`), an `http(s)://` URL or an `s3://` URL;
`FileRef | None` for an optional one."""

BUILTIN_FILE_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {
    AsrInput: ("audio",),
    TtsInput: ("reference_audio",),
    ImageInput: ("init_image", "mask_image"),
}
"""File fields of the built-in schemas, which predate the `FileRef` marker."""


@functools.cache  # schemas are classes: their fields do not change
def file_ref_fields(schema: type[BaseModel]) -> tuple[str, ...]:
    """Names of the fields of `schema` that hold file references."""
    marked = tuple(
        name
        for name, info in schema.model_fields.items()
        if any(isinstance(meta, FileRefMarker) for meta in info.metadata)
        or _marked(info.annotation)
    )
    return marked or BUILTIN_FILE_FIELDS.get(schema, ())


def _marked(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        base, *metadata = get_args(annotation)
        return any(isinstance(m, FileRefMarker) for m in metadata) or _marked(base)
    return any(_marked(arg) for arg in get_args(annotation))
