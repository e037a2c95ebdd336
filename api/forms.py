"""Multipart forms: their OpenAPI request body, from the model that validates their fields.

A multipart route reads its form itself, after the API key is checked (FastAPI would
parse it before), so FastAPI cannot see what the form takes. The route validates the
form's text fields with a pydantic model, and publishes that model with its file parts
(`multipart_body`): the document and the validation have one source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

NULL = {"type": "null"}


def without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (changed in place) without its `null` branch: a form field or a header or
    query parameter is absent or a text, never a JSON null."""
    options = schema.get("anyOf")
    if isinstance(options, list) and NULL in options:
        rest = [option for option in options if option != NULL]
        del schema["anyOf"]
        if len(rest) == 1:
            schema.update(rest[0])
        else:
            schema["anyOf"] = rest
    return schema


def multipart_body(fields: type[BaseModel], files: Mapping[str, str]) -> dict[str, Any]:
    """`openapi_extra` of a route whose form has the (required) file parts `files` (name:
    description) and the text fields that `fields` validates."""
    schema = fields.model_json_schema(mode="validation")
    if "$defs" in schema:
        raise TypeError(f"{fields.__name__}: a form's fields are texts, not nested models")
    properties: dict[str, Any] = {
        name: {"type": "string", "format": "binary", "description": description}
        for name, description in files.items()
    }
    for name, field in schema["properties"].items():
        properties[name] = without_null(field)
    body: dict[str, Any] = {
        "type": "object",
        "required": [*files, *schema.get("required", [])],
        "properties": properties,
    }
    if "additionalProperties" in schema:
        body["additionalProperties"] = schema["additionalProperties"]
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": body}}}}
