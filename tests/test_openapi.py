"""The OpenAPI document against what the routes validate: each published body, field and
parameter is the one the route checks with, so that a generated client or request that
keeps to the document is not refused for it, and one that breaks it is refused (422
naming the field). The API runs in this process (harness/inprocess.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from api.openai.batch_models import BatchCreate
from api.openai.embedding_models import EmbeddingRequest
from api.openai.image_edits import ImageEditForm
from api.openai.images import SIZE_PATTERN, ImageGenerationRequest
from api.openai.rerank_models import RerankRequest
from api.openai.speech import SpeechRequest
from api.openai.transcription_models import TranscriptionForm
from harness.inprocess import InProcess
from jobs.errors import InputError
from jobs.models import WebhookSpec
from jobs.schemas import AsrInput, EmbedInput, ImageInput, RerankInput, TtsInput, schema_for
from jobs.schemas.image import Side
from jobs.webhooks import EVENT_CHOICES
from jobstore.batch_records import ENDPOINTS
from jobstore.file_objects import PURPOSES
from storage.base import KEY_PATTERN, MAX_KEY_CHARS, validate_key

CONSTRAINTS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "enum",
    "const",
    "minItems",
    "maxItems",
)
"""The keywords of a JSON schema that refuse a value (the rest describe it)."""


@pytest.fixture
async def api(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with inprocess.owner("openapi") as client:
        yield client


@pytest.fixture
async def document(api: httpx.AsyncClient) -> dict[str, Any]:
    r = await api.get("/openapi.json")
    assert r.status_code == 200, r.text
    return dict(r.json())


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema`, or the component its `$ref` names."""
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def value_schema(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of a field's value: its non-null branch (with what applies to every
    branch), where it may be null."""
    options = [o for o in schema.get("anyOf", []) if o != {"type": "null"}]
    if len(options) == 1:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return rest | resolve(document, options[0])
    return resolve(document, schema)


def constraints(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value_schema({}, schema).items() if k in CONSTRAINTS}


def minimal(document: dict[str, Any], schema: dict[str, Any]) -> Any:
    """The least value that `schema` allows, built from what it says alone: an object
    with its required properties only."""
    schema = value_schema(document, schema)
    if "anyOf" in schema and "type" not in schema:
        return minimal(document, schema["anyOf"][0])
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        # Fields one of which is required (`oneOf`/`anyOf` of `required` lists): the first.
        either = (schema.get("oneOf") or schema.get("anyOf") or [{}])[0].get("required", [])
        required = [*schema.get("required", []), *either]
        return {name: minimal(document, props[name]) for name in required}
    if kind == "string":
        text = "a" * max(1, schema.get("minLength", 0))
        assert re.search(schema.get("pattern", ""), text), f"no minimal value for {schema}"
        return text
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -1) + 1)
        step = schema.get("multipleOf", 1)
        return -(-low // step) * step
    if kind == "boolean":
        return False
    if kind == "array":
        return [minimal(document, schema["items"])] * schema.get("minItems", 0)
    raise AssertionError(f"no minimal value for {schema}")


def breaking(schema: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Values just outside each bound that `schema` (a field's value) publishes."""
    if "maximum" in schema:
        yield "maximum", schema["maximum"] + 1
    if "minimum" in schema:
        yield "minimum", schema["minimum"] - 1
    if "exclusiveMinimum" in schema:
        yield "exclusiveMinimum", schema["exclusiveMinimum"]
    if "multipleOf" in schema:
        yield "multipleOf", schema.get("minimum", 0) + schema["multipleOf"] + 1
    if "maxLength" in schema:
        yield "maxLength", "a" * (schema["maxLength"] + 1)
    if schema.get("minLength", 0) > 0:
        yield "minLength", ""
    if "enum" in schema:
        yield "enum", "not-one-of-them"
    if "maxItems" in schema:
        yield "maxItems", [schema["items"].get("enum", ["a"])[0]] * (schema["maxItems"] + 1)


def kind_bodies(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The published submit bodies, by kind."""
    body = document["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    schema = body["schema"]
    assert schema["discriminator"]["propertyName"] == "kind"
    by_kind = {}
    for option in schema["oneOf"]:
        option = resolve(document, option)
        by_kind[option["properties"]["kind"]["const"]] = option
    assert set(schema["discriminator"]["mapping"]) == set(by_kind)
    return by_kind


@pytest.mark.anyio
async def test_the_submit_body_is_one_per_served_kind_with_its_input_model(
    document: dict[str, Any], inprocess: InProcess
) -> None:
    bodies = kind_bodies(document)
    assert sorted(bodies) == inprocess.settings.enabled_kinds == ["echo", "image", "llm", "sleep"]
    for kind, body in bodies.items():
        model = schema_for(kind, inprocess.settings)
        published = resolve(document, body["properties"]["input"])
        assert set(published["properties"]) == set(model.model_fields), kind
        assert published["additionalProperties"] is False
        assert set(published.get("required", [])) == {
            name for name, field in model.model_fields.items() if field.is_required()
        }
        assert body["required"] == ["kind", "input"]


@pytest.mark.anyio
async def test_a_body_of_a_kinds_required_fields_is_taken_and_one_past_a_bound_is_refused(
    api: httpx.AsyncClient, document: dict[str, Any]
) -> None:
    for kind, body in kind_bodies(document).items():
        schema = resolve(document, body["properties"]["input"])
        least = minimal(document, schema)
        r = await api.post("/v1/jobs", json={"kind": kind, "input": least})
        assert r.status_code == 202, (kind, least, r.text)

        r = await api.post("/v1/jobs", json={"kind": kind, "input": least | {"colour": 1}})
        assert (r.status_code, r.json()["error"]["param"]) == (422, "input.colour"), r.text
        for name, field in schema["properties"].items():
            for bound, value in breaking(value_schema(document, field)):
                r = await api.post("/v1/jobs", json={"kind": kind, "input": least | {name: value}})
                assert r.status_code == 422, (kind, name, bound, value, r.text)
                assert r.json()["error"]["param"] == f"input.{name}", (kind, bound, r.text)


@pytest.mark.anyio
async def test_no_parameter_is_published_as_nullable(document: dict[str, Any]) -> None:
    """A header or query parameter is absent or a text: the text `null` is refused."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                assert {"type": "null"} not in parameter["schema"].get("anyOf", []), (
                    method,
                    path,
                    parameter["name"],
                )


@pytest.mark.parametrize(
    ("request_model", "job_model", "fields"),
    [
        (ImageGenerationRequest, ImageInput, {
            "prompt": "prompt", "n": "n", "negative_prompt": "negative_prompt",
            "steps": "steps", "guidance_scale": "guidance_scale", "seed": "seed",
            "scheduler": "scheduler", "response_format": "response_format",
            "output_format": "format",
        }),
        (SpeechRequest, TtsInput, {
            "input": "text", "speed": "speed", "sample_rate": "sample_rate",
            "language": "language", "reference_audio": "reference_audio",
        }),
        (TranscriptionForm, AsrInput, {
            "language": "language", "prompt": "initial_prompt",
            "temperature": "temperature", "beam_size": "beam_size",
        }),
        (EmbeddingRequest, EmbedInput, {"input": "input"}),
        (RerankRequest, RerankInput, {
            "query": "query", "top_n": "top_n", "return_documents": "return_documents",
        }),
    ],
)  # fmt: skip
def test_an_openai_request_publishes_its_job_inputs_constraints(
    request_model: type[BaseModel], job_model: type[BaseModel], fields: dict[str, str]
) -> None:
    """Each OpenAI request field that becomes a job input field takes what it takes."""
    published = request_model.model_json_schema()["properties"]
    job = job_model.model_json_schema()["properties"]
    for field, job_field in fields.items():
        if field == "input" and job_model is EmbedInput:  # one text or a list of texts
            assert published[field]["anyOf"] == job[job_field]["anyOf"]
            continue
        assert constraints(published[field]) == constraints(job[job_field]), field


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/images/generations", "steps", 0),
        ("/v1/images/generations", "guidance_scale", 31),
        ("/v1/images/generations", "scheduler", "fastest"),
        ("/v1/images/generations", "size", "65x64"),
        ("/v1/images/generations", "quality", "hd"),
        ("/v1/embeddings", "input", [1, 2]),
        ("/v1/embeddings", "dimensions", 0),
        ("/v1/rerank", "top_n", 0),
        ("/v2/rerank", "query", 5),
        ("/v1/audio/speech", "speed", 5),
        ("/v1/audio/speech", "instructions", "whisper"),
        ("/v1/audio/speech", "response_format", "ogg"),
        ("/v1/audio/speech", "input", "a\x00b"),
    ],
)
async def test_an_openai_request_outside_its_schema_is_refused_naming_the_field(
    api: httpx.AsyncClient, document: dict[str, Any], path: str, field: str, value: Any
) -> None:
    body_schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    schema = resolve(document, body_schema["schema"])
    if field in schema["properties"]:
        published = value_schema(document, schema["properties"][field])
        assert not _allows(published, value), (field, published)
    else:
        assert schema["additionalProperties"] is False
    body = minimal(document, schema) | {field: value}
    r = await api.post(path, json=body)
    assert (r.status_code, r.json()["error"]["param"]) == (422, field), r.text


TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "array": list,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def _allows(schema: dict[str, Any], value: Any) -> bool:
    """Whether `value` keeps to what `schema` publishes (the keywords used here)."""
    if "anyOf" in schema:
        return any(_allows(option, value) for option in schema["anyOf"])
    if "type" in schema and not isinstance(value, TYPES[schema["type"]]):
        return False
    checks = [
        ("minimum", lambda bound: value >= bound),
        ("maximum", lambda bound: value <= bound),
        ("enum", lambda choices: value in choices),
        ("pattern", lambda pattern: re.search(pattern, value) is not None),
        ("maxLength", lambda bound: len(value) <= bound),
        ("items", lambda items: all(_allows(items, item) for item in value)),
    ]
    return all(check(schema[key]) for key, check in checks if key in schema)


@pytest.mark.anyio
async def test_an_event_id_past_64_bits_is_refused_as_published(
    api: httpx.AsyncClient, document: dict[str, Any]
) -> None:
    """Redis refuses a stream id whose numbers do not fit 64 bits: the document says so,
    and the route refuses one with 422 rather than break the stream."""
    r = await api.post("/v1/jobs", json={"kind": "echo", "input": {"text": "a"}})
    events = f"/v1/jobs/{r.json()['id']}/events"
    parameters = document["paths"]["/v1/jobs/{job_id}/events"]["get"]["parameters"]
    huge = "1" * 20 + "-0"
    for name, where in [("last-event-id", "header"), ("after", "query")]:
        (published,) = [p for p in parameters if p["name"] == name and p["in"] == where]
        assert re.search(published["schema"]["pattern"], huge) is None
        assert re.search(published["schema"]["pattern"], "1764138792000-12")
    r = await api.get(events, headers={"Last-Event-ID": huge})
    assert (r.status_code, r.json()["error"]["param"]) == (422, "last-event-id"), r.text
    r = await api.get(events, params={"after": huge})
    assert (r.status_code, r.json()["error"]["param"]) == (422, "after"), r.text


def _form(document: dict[str, Any], path: str) -> dict[str, Any]:
    content = document["paths"][path]["post"]["requestBody"]["content"]
    schema: dict[str, Any] = content["multipart/form-data"]["schema"]
    return schema


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
async def test_the_transcription_form_is_published_from_the_model_it_is_checked_with(
    api: httpx.AsyncClient, document: dict[str, Any], path: str
) -> None:
    form = _form(document, path)
    assert set(form["properties"]) == {"file", *TranscriptionForm.model_fields}
    assert form["properties"]["file"]["format"] == "binary"
    assert form["required"] == ["file", "model"]
    assert form["additionalProperties"] is False
    assert form["properties"]["response_format"]["enum"] == [
        "json", "text", "srt", "vtt", "verbose_json"
    ]  # fmt: skip
    audio = {"file": ("a.wav", b"RIFF", "audio/wav")}
    for field, value in [
        ("response_format", "mp4"),
        ("language", "English"),
        ("beam_size", "11"),
        ("colour", "red"),
    ]:
        r = await api.post(path, files=audio, data={"model": "whisper-1", field: value})
        assert (r.status_code, r.json()["error"]["param"]) == (422, field), r.text


@pytest.mark.anyio
async def test_the_upload_form_and_file_keys_are_published_as_checked(
    api: httpx.AsyncClient, document: dict[str, Any]
) -> None:
    form = _form(document, "/v1/files")
    assert form["required"] == ["file"]
    assert tuple(form["properties"]["purpose"]["enum"]) == PURPOSES
    r = await api.post("/v1/files", files={"file": ("a.txt", b"x")}, data={"purpose": "art"})
    assert (r.status_code, r.json()["error"]["param"]) == (422, "purpose"), r.text

    for method in ("get", "delete"):
        parameters = document["paths"]["/v1/files/{key}"][method]["parameters"]
        (key,) = [p for p in parameters if p["name"] == "key"]
        assert key["schema"]["pattern"] == KEY_PATTERN
        assert key["schema"]["maxLength"] == MAX_KEY_CHARS
    r = await api.delete("/v1/files/openapi/uploads/.hidden")
    assert (r.status_code, r.json()["error"]["param"]) == (422, "key"), r.text


@pytest.mark.parametrize(
    "key",
    [
        "alice/uploads/0a/voice.wav",
        "a",
        "a/b_c-d.e",
        "/a",
        "a//b",
        "a/./b",
        "a/../b",
        ".a",
        "a/.b",
        "a\\b",
        "a b",
        "a\n",
        "é",
        "a/" + "b" * 128,
        "a/" + "b" * 129,
        "/".join(["abc"] * 130),
    ],
)
def test_the_published_key_pattern_is_what_validate_key_takes(key: str) -> None:
    published = re.fullmatch(KEY_PATTERN, key) is not None and len(key) <= MAX_KEY_CHARS
    try:
        validate_key(key)
        taken = True
    except InputError:
        taken = False
    assert published == taken


def test_the_published_size_is_what_the_job_takes_for_a_side() -> None:
    side = TypeAdapter(Side)
    pattern = re.compile(SIZE_PATTERN)
    for n in range(100_000):
        try:
            side.validate_python(n)
            taken = True
        except ValidationError:
            taken = False
        assert (pattern.fullmatch(f"{n}x64") is not None) == taken, n
    assert pattern.fullmatch("auto")


def test_choices_checked_by_a_validator_are_published() -> None:
    events = WebhookSpec.model_json_schema()["properties"]["events"]["items"]["enum"]
    assert set(events) == EVENT_CHOICES
    endpoint = BatchCreate.model_json_schema()["properties"]["endpoint"]
    assert tuple(endpoint["enum"]) == ENDPOINTS


def unbounded_numbers(
    node: Any, where: str, schemas: dict[str, Any], seen: frozenset[str]
) -> set[str]:
    """Where an integer or number under `node` has no maximum (components followed once)."""
    found: set[str] = set()
    if isinstance(node, list):
        for value in node:
            found |= unbounded_numbers(value, where, schemas, seen)
        return found
    if not isinstance(node, dict):
        return found
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[1]
        return (
            set()
            if name in seen
            else unbounded_numbers(schemas[name], name, schemas, seen | {name})
        )
    bounded = "maximum" in node or "exclusiveMaximum" in node or "enum" in node
    if node.get("type") in ("integer", "number") and not bounded:
        found.add(where)
    for key, value in node.items():
        found |= unbounded_numbers(value, f"{where}.{key}", schemas, seen)
    return found


@pytest.mark.anyio
async def test_every_number_a_request_may_send_has_bounds(document: dict[str, Any]) -> None:
    """Every integer and number in every request body and parameter the document
    publishes has a maximum (and the server checks it): 10**30 is a 422 naming its field,
    never a value that reaches code that cannot hold it."""
    schemas = document["components"]["schemas"]
    inputs = [
        (f"{method} {path} {where}", schema)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for where, schema in [
            *((p["name"], p.get("schema", {})) for p in operation.get("parameters", [])),
            *(("body", m.get("schema", {}))
              for m in operation.get("requestBody", {}).get("content", {}).values()),
        ]
    ]  # fmt: skip
    unbounded = set().union(*(unbounded_numbers(s, w, schemas, frozenset()) for w, s in inputs))
    assert sorted(unbounded) == []


@pytest.mark.anyio
async def test_the_image_edit_form_is_published_from_the_model_it_is_checked_with(
    api: httpx.AsyncClient, document: dict[str, Any]
) -> None:
    form = _form(document, "/v1/images/edits")
    assert set(form["properties"]) == {"image", "mask", *ImageEditForm.model_fields}
    assert form["properties"]["image"]["format"] == form["properties"]["mask"]["format"]
    assert form["required"] == ["image", "prompt"]  # the mask is optional
    assert form["additionalProperties"] is False
    assert form["properties"]["size"]["pattern"] == SIZE_PATTERN
    image = {"image": ("a.png", b"\x89PNG\r\n\x1a\n", "image/png")}
    for field, value in [("strength", "1.5"), ("quality", "high"), ("colour", "red")]:
        r = await api.post("/v1/images/edits", files=image, data={"prompt": "a", field: value})
        assert (r.status_code, r.json()["error"]["param"]) == (422, field), r.text
