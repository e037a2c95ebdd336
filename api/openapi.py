"""The OpenAPI document, published from what the routes validate with.

FastAPI writes the document from each route's signature. Two things it cannot see from
there are put right here, once, when the document is first asked for, in the JSON that
FastAPI made (typed as FastAPI types it: any OpenAPI document is JSON of its own):

- `POST /v1/jobs` takes a `JobCreate` whose `input` is any object, then validates
  `input` with the input model of its `kind` (`JobService.validate`), so that each kind's
  errors name `input.FIELD`. The document shows what that validation takes: one body
  per kind this deployment serves, with its kind's input model, chosen by `kind` (a
  `oneOf` with a discriminator), generated from those models.
- A header or query parameter is absent or a value: FastAPI publishes an optional one
  as `anyOf: [value, null]`, and a client that believes it may be null sends the text
  `null`, which is refused. The document shows the value alone.
- A route declares the events of its `text/event-stream` answer with their models'
  schema (`api.openai.protocol.event_stream`), whose `$defs` join the document's
  components here.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import Field, TypeAdapter, create_model
from pydantic.json_schema import JsonSchemaValue

from api.forms import without_null
from api.openai.protocol import REF_TEMPLATE
from api.routes.jobs import router as jobs_router
from api.routes.jobs import submit_job
from jobs.models import JobCreate
from jobs.schemas import schema_for
from jobs.settings import Settings


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the corrected document at `/openapi.json` (and in `/docs`)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            publish_job_bodies(document, settings)
            publish_response_defs(document)
            drop_null_parameters(document)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def job_bodies(settings: Settings) -> dict[str, type[JobCreate]]:
    """`JobCreate` of each kind this deployment serves: its `kind` and its `input` model."""
    bodies: dict[str, type[JobCreate]] = {}
    for kind in settings.enabled_kinds:
        try:
            schema = schema_for(kind, settings)
        except KeyError:  # no input model: the API refuses the kind, so it is not shown
            continue
        only_this_kind: Any = Literal.__getitem__(kind)
        bodies[kind] = create_model(
            "JobCreate_" + re.sub(r"[^A-Za-z0-9_]", "_", kind),
            __base__=JobCreate,
            __doc__=f"A `{kind}` job.",
            kind=(
                only_this_kind,
                Field(description="One of the kinds this deployment serves (`GET /readyz`)."),
            ),
            input=(schema, ...),
        )
    return bodies


def job_body_schema(bodies: dict[str, type[JobCreate]]) -> JsonSchemaValue:
    """The JSON schema of a submit's body: one of `bodies`, chosen by `kind`; its models
    in `$defs`, referred to as components."""
    models = list(bodies.values())
    if len(models) == 1:
        return TypeAdapter(models[0]).json_schema(ref_template=REF_TEMPLATE)
    union: Any = functools.reduce(operator.or_, models)
    adapter: TypeAdapter[Any] = TypeAdapter(Annotated[union, Field(discriminator="kind")])
    return adapter.json_schema(ref_template=REF_TEMPLATE)


def publish_job_bodies(document: dict[str, Any], settings: Settings) -> None:
    """The submit route's body as `job_body_schema`: what `JobService.validate` takes."""
    bodies = job_bodies(settings)
    if not bodies:
        return  # nothing is served: the generic body, and 422 naming `kind`
    schema = job_body_schema(bodies)
    components = document.setdefault("components", {}).setdefault("schemas", {})
    schema = _with_components(schema, components)
    body = _operation(document, submit_job)["requestBody"]
    body["content"]["application/json"]["schema"] = schema


def _operation(document: dict[str, Any], endpoint: Callable[..., Any]) -> dict[str, Any]:
    """The document's operation of the route whose function is `endpoint`."""
    ids = {
        r.unique_id
        for r in jobs_router.routes
        if isinstance(r, APIRoute) and r.endpoint is endpoint
    }
    for path in document["paths"].values():
        for operation in path.values():
            if isinstance(operation, dict) and operation.get("operationId") in ids:
                return operation
    raise LookupError(f"no operation of {endpoint.__name__} in the document")


def publish_response_defs(document: dict[str, Any]) -> None:
    """Each response schema's `$defs` (an event stream's models) as components."""
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for response in operation.get("responses", {}).values():
                for content in response.get("content", {}).values():
                    if "$defs" in content.get("schema", {}):
                        content["schema"] = _with_components(content["schema"], components)


def _with_components(
    schema: JsonSchemaValue, components: dict[str, JsonSchemaValue]
) -> JsonSchemaValue:
    """`schema` without its `$defs`, which join `components`: a name that the document
    already gives another schema is renamed, and the references to it too."""
    defs: dict[str, JsonSchemaValue] = schema.pop("$defs", {})
    renamed: dict[str, str] = {}
    for name, definition in defs.items():
        new = name
        while new in components and components[new] != definition:
            new += "_"
        renamed[name] = new
    refs = {
        REF_TEMPLATE.format(model=old): REF_TEMPLATE.format(model=new)
        for old, new in renamed.items()
        if old != new
    }
    for name, definition in defs.items():
        components[renamed[name]] = _rewrite_refs(definition, refs)
    result: JsonSchemaValue = _rewrite_refs(schema, refs)
    return result


def _rewrite_refs(value: Any, refs: dict[str, str]) -> Any:
    """`value` with every reference in `refs` (a `$ref`, a discriminator's mapping)
    replaced."""
    if isinstance(value, dict):
        return {key: _rewrite_refs(item, refs) for key, item in value.items()}
    if isinstance(value, list):
        return [_rewrite_refs(item, refs) for item in value]
    return refs.get(value, value) if isinstance(value, str) else value


def drop_null_parameters(document: dict[str, Any]) -> None:
    """An optional parameter's schema is its value's, not `anyOf: [value, null]`."""
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []):
                without_null(parameter["schema"])
