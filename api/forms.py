"""Multipart forms: their OpenAPI request body, from the model that validates their fields.

A multipart route reads its form itself, after the API key is checked (FastAPI would
parse it before), so FastAPI cannot see what the form takes. The route validates the
form's text fields with a pydantic model, and publishes that model with its file parts
(`multipart_body`): the document and the validation have one source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel

NULL = {"type": "null"}


def without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (a JSON schema, changed in place) without its `null` branch: a form field
    or a header or query parameter is absent or a text, never a JSON null."""
    options = schema.get("anyOf")
    if isinstance(options, list) and NULL in options:
        rest = [option for option in options if option != NULL]
        del schema["anyOf"]
        if len(rest) == 1:
            schema.update(rest[0])
        else:
            schema["anyOf"] = rest
    return schema


class FormSchema(TypedDict):
    """The JSON schema of a multipart form: its file parts and text fields."""

    type: Literal["object"]
    required: list[str]
    properties: dict[str, dict[str, Any]]
    """Each part's JSON schema (a text field's is its model's)."""
    additionalProperties: NotRequired[bool]


def multipart_body(
    fields: type[BaseModel],
    files: Mapping[str, str],
    optional_files: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`openapi_extra` of a route (FastAPI's type: OpenAPI's JSON) whose form has the
    required file parts `files` and the optional ones `optional_files` (name:
    description) and the text fields that `fields` validates."""
    schema = fields.model_json_schema(mode="validation")
    if "$defs" in schema:
        raise TypeError(f"{fields.__name__}: a form's fields are texts, not nested models")
    body: FormSchema = {
        "type": "object",
        "required": [*files, *schema.get("required", [])],
        "properties": {
            name: {"type": "string", "format": "binary", "description": description}
            for name, description in {**files, **(optional_files or {})}.items()
        },
    }
    for name, field in schema["properties"].items():
        body["properties"][name] = without_null(field)
    if "additionalProperties" in schema:
        body["additionalProperties"] = schema["additionalProperties"]
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": body}}}}
