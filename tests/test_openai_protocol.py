"""The OpenAI routes' typed protocol (`api/openai/protocol.py`): every route's 200 is
described by a schema of the OpenAPI document, the answers of an API in this process
(its jobs ended by the test as a worker ends them) keep to the schema and the model that
their route declares, and a request that holds a field it does not carry is refused with
a 422 naming it, on every route."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import jsonschema
import pytest
import redis
from pydantic import BaseModel, TypeAdapter

from api.error_handlers import ErrorResponse
from api.openai.batch_models import (
    Batch,
    BatchList,
    FileDeleted,
    FileList,
    OpenAIFile,
    UploadedFile,
)
from api.openai.completion_models import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
)
from api.openai.embedding_models import EmbeddingList
from api.openai.images import ImagesResponse
from api.openai.protocol import ModelList
from api.openai.speech import SpeechAudioDelta, SpeechAudioDone, SpeechError, VoiceList
from api.openai.transcription_models import (
    Transcription,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
)
from common.sse import parse_lines
from harness.inprocess import InProcess, inprocess_settings, serve_in_process
from jobs import keys
from jobs.models import EventType
from jobs.settings import PipelineConfig
from jobstore import operations
from jobstore.changes import Lease
from jobstore.codec import job_from_fields
from jobstore.store import JobStore
from tuning.deployment import flush

pytestmark = pytest.mark.anyio

Json = dict[str, Any]
USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
PNG_FILE = {
    "image": ("a.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + struct.pack(">II", 64, 64), "image/png")
}
"""An edit's image part: a PNG's header (the API reads no further; the worker decodes)."""
PIPELINES = {
    "embed": PipelineConfig(kind="embed", impl="pipelines.embed:EmbedPipeline"),
    "asr": PipelineConfig(kind="asr", impl="pipelines.asr:AsrPipeline"),
    "tts": PipelineConfig(
        kind="tts",
        impl="pipelines.tts:TtsPipeline",
        aliases=["tts-1"],
        options={"default_voice": "joe", "voices": {"joe": {"engine": "piper"}}},
    ),
}
"""Beside the in-process API's own (`harness.inprocess`): a pipeline of each kind left."""


class Worker:
    """Ends an owner's next job as a worker would: started, its partial events, its
    output."""

    def __init__(self, redis_url: str, served: InProcess) -> None:
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        self.store = JobStore(client, served.settings)
        self.redis = served.redis
        self.done: set[str] = set()

    async def run(self, owner: str, partials: list[Json], output: Json) -> None:
        job_id = await self._next(owner)
        await anyio.to_thread.run_sync(self._run, job_id, partials, output)

    async def _next(self, owner: str) -> str:
        with anyio.fail_after(10):
            while True:
                ids = set(self.redis.zrange(keys.owner_jobs(owner), 0, -1)) - self.done
                if ids:
                    (job_id,) = ids
                    self.done.add(job_id)
                    return str(job_id)
                await anyio.sleep(0.01)

    def _run(self, job_id: str, partials: list[Json], output: Json) -> None:
        job = self.store.get(job_id)
        assert job is not None
        lease = Lease("w", 5000)
        started = self.store.apply(operations.start(job_id, job.kind, lease, "w"))
        assert started.ok, started
        for data in partials:
            self.store.append_event(job_id, EventType.PARTIAL, data, first_output=True)
        running = job_from_fields(started.read_back)
        assert self.store.apply(operations.succeed(running, lease, output)).ok


@pytest.fixture
async def served(redis_url: str, tmp_path: Path) -> AsyncIterator[InProcess]:
    """The in-process API with a pipeline of every kind (no worker: `Worker` ends jobs)."""
    flush(redis_url)
    settings = inprocess_settings(redis_url, tmp_path)
    pipelines = settings.pipelines | PIPELINES
    async with serve_in_process(settings.model_copy(update={"pipelines": pipelines})) as app:
        yield app


@pytest.fixture
async def document(served: InProcess) -> Json:
    async with served.client() as client:
        return dict((await client.get("/openapi.json")).json())


def _openai_operations(document: Json) -> list[tuple[str, str, Json]]:
    return [
        (method, path, operation)
        for path, operations_ in document["paths"].items()
        for method, operation in operations_.items()
        if "openai" in operation.get("tags", [])
    ]


def _component(document: Json, schema: Json) -> Json:
    name = schema["$ref"].removeprefix("#/components/schemas/")
    found: Json = document["components"]["schemas"][name]
    return found


async def test_every_openai_answer_is_described_by_a_schema(document: Json) -> None:
    """Each 200 of an OpenAI route names its content's schema: a model of the
    document's components for JSON and for each event of a stream, and a string for
    text and audio; each error names OpenAI's error body."""
    operations_ = _openai_operations(document)
    assert len(operations_) >= 13
    for method, path, operation in operations_:
        ok = operation["responses"]["200"]["content"]
        assert "application/json" in ok or "text/event-stream" in ok, (method, path)
        for media, content in ok.items():
            schema = content["schema"]
            if media in ("application/json", "text/event-stream"):
                refs = schema.get("oneOf") or schema.get("anyOf") or [schema]
                for ref in refs:
                    assert _component(document, ref)["properties"], (method, path, media)
            else:
                assert schema["type"] == "string", (method, path, media)
        for status, response in operation["responses"].items():
            if status.startswith(("4", "5")):
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, status)


def _validator(document: Json, schema: Json) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator({**schema, "components": document["components"]})


def _declared(document: Json, method: str, path: str, media: str) -> Json:
    operation = document["paths"][path][method]
    schema: Json = operation["responses"]["200"]["content"][media]["schema"]
    return schema


def _check(document: Json, r: httpx.Response, model: Any, path: str, method: str = "post") -> Json:
    """`r`'s JSON body keeps to its route's declared schema and to `model`, with nothing
    left over (a model that would drop a field would not give the body back)."""
    assert r.status_code == 200, r.text
    body: Json = r.json()
    _validator(document, _declared(document, method, path, "application/json")).validate(body)
    adapter: TypeAdapter[BaseModel] = TypeAdapter(model)
    assert adapter.dump_python(adapter.validate_json(r.content), mode="json") == body
    return body


def _check_events(
    document: Json, r: httpx.Response, path: str, *models: type[BaseModel]
) -> list[Json]:
    """Each event of `r`'s stream keeps to the declared schema and to one of `models`."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    validator = _validator(document, _declared(document, "post", path, "text/event-stream"))
    union: Any = models[0] if len(models) == 1 else models[0] | models[1]
    for model in models[2:]:
        union = union | model
    adapter: TypeAdapter[BaseModel] = TypeAdapter(union)
    events = []
    for message in parse_lines(iter(r.text.splitlines())):
        if message.data == "[DONE]":
            continue
        event = json.loads(message.data)
        validator.validate(event)
        assert adapter.dump_python(adapter.validate_python(event), mode="json") == event
        events.append(event)
    assert events
    return events


class Ran:
    """An owner's client, whose requests' jobs a `Worker` runs to their end."""

    def __init__(self, worker: Worker, client: httpx.AsyncClient, owner: str) -> None:
        self.worker, self.client, self.owner = worker, client, owner

    async def post(
        self, path: str, partials: list[Json], output: Json, **request: Any
    ) -> httpx.Response:
        """The answer of `POST path` (`request`: httpx's arguments), its job ended with
        `partials` and `output`."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self.worker.run, self.owner, partials, output)
            response = await self.client.post(path, **request)
        return response


async def test_chat_and_text_completions_keep_to_their_declared_models(
    served: InProcess, document: Json, redis_url: str
) -> None:
    worker = Worker(redis_url, served)
    deltas = [{"index": 0, "text": "Hel"}, {"index": 1, "text": 'lo "there"'}]
    output = {"text": 'Hello "there"', "finish_reason": "stop", "usage": USAGE, "cached": False}
    async with served.owner("chat") as client:
        ran = Ran(worker, client, "chat")
        r = await ran.post("/v1/chat/completions", deltas, output, json=CHAT)
        assert _check(document, r, ChatCompletion, "/v1/chat/completions")["choices"][0][
            "message"
        ] == {"role": "assistant", "content": 'Hello "there"'}

        stream = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
        r = await ran.post("/v1/chat/completions", deltas, output, json=stream)
        chunks = _check_events(
            document, r, "/v1/chat/completions", ChatCompletionChunk, ErrorResponse
        )
        assert [c["choices"][0]["delta"] for c in chunks[:3]] == [
            {"role": "assistant", "content": ""},
            {"content": "Hel"},
            {"content": 'lo "there"'},
        ]
        assert chunks[3]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE
        assert r.text.endswith("data: [DONE]\n\n")

        text = {"model": "m", "prompt": "Once"}
        r = await ran.post("/v1/completions", deltas, output, json=text)
        _check(document, r, Completion, "/v1/completions")
        r = await ran.post("/v1/completions", deltas, output, json=text | {"stream": True})
        chunks = _check_events(document, r, "/v1/completions", CompletionChunk, ErrorResponse)
        assert [c["choices"][0]["text"] for c in chunks] == ["Hel", 'lo "there"', ""]


async def test_tool_calls_and_log_probabilities_keep_to_the_declared_models(
    served: InProcess, document: Json, redis_url: str
) -> None:
    """As an engine that serves them streams them (the vLLM pipeline `v`), passed on as
    the engine wrote them."""
    worker = Worker(redis_url, served)
    logprob = {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    more = {"index": 0, "function": {"arguments": '{"a": 1}'}}
    deltas = [
        {"index": 0, "text": "Hi", "logprobs": [logprob]},
        {"index": 1, "text": "", "tool_calls": [call]},
        {"index": 2, "text": "", "tool_calls": [more]},
    ]
    whole = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    output = {
        "text": "Hi",
        "finish_reason": "tool_calls",
        "tool_calls": [whole],
        "logprobs": {"content": [logprob]},
        "usage": USAGE,
        "cached": False,
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = CHAT | {"model": "v", "tools": tools, "logprobs": True}
    async with served.owner("tools") as client:
        ran = Ran(worker, client, "tools")
        r = await ran.post("/v1/chat/completions", deltas, output, json=body)
        choice = _check(document, r, ChatCompletion, "/v1/chat/completions")["choices"][0]
        assert choice["message"]["tool_calls"] == [whole]
        assert choice["logprobs"] == {"content": [logprob]}

        streamed = body | {"stream": True}
        r = await ran.post("/v1/chat/completions", deltas, output, json=streamed)
        chunks = _check_events(
            document, r, "/v1/chat/completions", ChatCompletionChunk, ErrorResponse
        )
        assert chunks[1]["choices"][0]["logprobs"] == {"content": [logprob]}
        assert [c["choices"][0]["delta"].get("tool_calls") for c in chunks[2:4]] == [
            [call],
            [more],
        ]


async def test_embeddings_images_and_models_keep_to_their_declared_models(
    served: InProcess, document: Json, redis_url: str
) -> None:
    worker = Worker(redis_url, served)
    vector = base64.b64encode(struct.pack("<3f", 0.5, -1.0, 2.0)).decode()
    output = {"embeddings": [vector], "usage": {"prompt_tokens": 3, "total_tokens": 3}}
    image = {"key": "k", "url": "https://example.test/i.png", "b64_json": "AAAA"}
    async with served.owner("various") as client:
        ran = Ran(worker, client, "various")
        for fmt in ("float", "base64"):
            body = {"model": "embed", "input": "a cat", "encoding_format": fmt}
            r = await ran.post("/v1/embeddings", [], output, json=body)
            data = _check(document, r, EmbeddingList, "/v1/embeddings")["data"]
            assert data[0]["embedding"] == ([0.5, -1.0, 2.0] if fmt == "float" else vector)

        for fmt in ("url", "b64_json"):
            body = {"prompt": "a cat", "size": "64x64", "response_format": fmt}
            made = {"images": [image], "width": 64, "height": 64}
            r = await ran.post("/v1/images/generations", [], made, json=body)
            data = _check(document, r, ImagesResponse, "/v1/images/generations")["data"]
            assert data == [{fmt: image[fmt], "revised_prompt": None}]
            r = await ran.post("/v1/images/edits", [], made, files=PNG_FILE, data=body)
            data = _check(document, r, ImagesResponse, "/v1/images/edits")["data"]
            assert data == [{fmt: image[fmt], "revised_prompt": None}]

        cards = _check(document, await client.get("/v1/models"), ModelList, "/v1/models", "get")
        chat = [card for card in cards["data"] if card["pipeline"] == "chat"]
        assert chat and all(card["model"] == "m" for card in chat)  # which names are one model
        voices = await client.get("/v1/audio/voices")
        assert _check(document, voices, VoiceList, "/v1/audio/voices", "get")["data"]


async def test_transcriptions_and_speech_keep_to_their_declared_models(
    served: InProcess, document: Json, redis_url: str
) -> None:
    worker = Worker(redis_url, served)
    segment = {
        "id": 0, "seek": 0, "start": 0.0, "end": 1.5, "text": " Hello.", "tokens": [1, 2],
        "temperature": 0.0, "avg_logprob": -0.2, "compression_ratio": 1.1,
        "no_speech_prob": 0.01,
        "words": [{"word": " Hello.", "start": 0.0, "end": 1.5, "probability": 0.9}],
    }  # fmt: skip
    output = {"text": "Hello.", "language": "en", "duration": 1.5, "segments": [segment]}
    path = "/v1/audio/transcriptions"
    files = {"file": ("a.wav", b"RIFF0000WAVEfmt ", "audio/wav")}
    whisper = {"model": "whisper-1"}
    async with served.owner("audio") as client:
        ran = Ran(worker, client, "audio")
        r = await ran.post(path, [], output, files=files, data=whisper)
        assert _check(document, r, Transcription | TranscriptionVerbose, path)["text"] == "Hello."
        verbose = whisper | {"response_format": "verbose_json", "timestamp_granularities[]": "word"}
        r = await ran.post(path, [], output, files=files, data=verbose)
        body = _check(document, r, Transcription | TranscriptionVerbose, path)
        assert body["words"] == [{"word": "Hello.", "start": 0.0, "end": 1.5}]
        streamed = whisper | {"stream": "true"}
        r = await ran.post(path, [{"segment": segment}], output, files=files, data=streamed)
        events = _check_events(
            document, r, path, TranscriptTextDelta, TranscriptTextDone, ErrorResponse
        )
        assert events == [
            {"type": "transcript.text.delta", "delta": "Hello."},
            {"type": "transcript.text.done", "text": "Hello."},
        ]

        speech = {"model": "tts-1", "voice": "joe", "input": "Hi.", "response_format": "pcm",
                  "stream_format": "sse"}  # fmt: skip
        chunk = {"seq": 0, "sample_rate": 24000, "audio": base64.b64encode(b"\0\0").decode()}
        r = await ran.post("/v1/audio/speech", [chunk], {"audio": {"key": "k"}}, json=speech)
        events = _check_events(
            document, r, "/v1/audio/speech", SpeechAudioDelta, SpeechAudioDone, SpeechError
        )
        assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.done"]


async def test_batches_and_files_keep_to_their_models(served: InProcess, document: Json) -> None:
    """The batch routes declare their models; the file routes' answers are the file models
    of the protocol too."""
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    async with served.owner("batcher") as client:
        r = await client.post(
            "/v1/files", files={"file": ("in.jsonl", json.dumps(line).encode())},
            data={"purpose": "batch"},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        uploaded = UploadedFile.model_validate_json(r.content)
        assert uploaded.model_dump(mode="json") == r.json()
        listed = await client.get("/v1/files")
        assert FileList.model_validate_json(listed.content).model_dump(mode="json") == listed.json()
        one = await client.get(f"/v1/files/{uploaded.id}")
        assert OpenAIFile.model_validate_json(one.content).model_dump(mode="json") == one.json()

        body = {"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions"}
        created = _check(
            document, await client.post("/v1/batches", json=body), Batch, "/v1/batches"
        )
        assert created["request_counts"]["total"] == 1
        _check(document, await client.get("/v1/batches"), BatchList, "/v1/batches", "get")
        one_path = "/v1/batches/{batch_id}"
        _check(document, await client.get(f"/v1/batches/{created['id']}"), Batch, one_path, "get")
        canceled = await client.post(f"/v1/batches/{created['id']}/cancel")
        _check(document, canceled, Batch, "/v1/batches/{batch_id}/cancel")

        deleted = await client.delete(f"/v1/files/{uploaded.id}")
        assert FileDeleted.model_validate_json(deleted.content).model_dump() == deleted.json()


PART = {"type": "text", "text": "Hi"}
UNKNOWN_FIELDS = [
    ("/v1/chat/completions", CHAT, "colour"),
    ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": "Hi", "colour": 1}]},
     "messages.0.colour"),
    ("/v1/chat/completions",
     CHAT | {"messages": [{"role": "user", "content": [PART | {"colour": 1}]}]},
     "messages.0.content.0.colour"),
    ("/v1/chat/completions", CHAT | {"stream": True, "stream_options": {"colour": 1}},
     "stream_options.colour"),
    ("/v1/completions", {"model": "m", "prompt": "Once"}, "colour"),
    ("/v1/embeddings", {"model": "embed", "input": "a"}, "colour"),
    ("/v1/rerank", {"query": "q", "documents": ["a", {"text": "b", "colour": 1}]},
     "documents.1.colour"),
    ("/v2/rerank", {"query": "q", "documents": ["a"]}, "colour"),
    ("/v1/images/generations", {"prompt": "a cat"}, "colour"),
    ("/v1/images/edits", {"prompt": "a cat"}, "colour"),
    ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy", "input": "Hi."}, "colour"),
    ("/v1/audio/transcriptions", {"model": "whisper-1"}, "colour"),
    ("/v1/audio/translations", {"model": "whisper-1"}, "colour"),
    ("/v1/batches", {"input_file_id": "file-x", "endpoint": "/v1/embeddings"}, "colour"),
    ("/v1/realtime/client_secrets", {"session": {"type": "realtime"}}, "colour"),
    ("/v1/responses", {"model": "m", "input": "Hi"}, "colour"),
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": "Hi", "colour": 1}]},
     "input.0.colour"),
    ("/v1/responses",
     {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "a",
                                                            "colour": 1}]}]},
     "input.0.content.0.colour"),
    ("/v1/responses", {"model": "m", "input": "Hi", "text": {"format": {"type": "text"},
                                                              "colour": 1}},
     "text.colour"),
]  # fmt: skip
"""A valid request of each OpenAI route that takes one, and where an unknown field goes."""


async def test_every_openai_route_that_takes_a_body_is_tried_with_an_unknown_field(
    document: Json,
) -> None:
    taking = {
        path
        for method, path, operation in _openai_operations(document)
        if "requestBody" in operation
    }
    assert taking == {path for path, _, _ in UNKNOWN_FIELDS}


@pytest.mark.parametrize(("path", "body", "field"), UNKNOWN_FIELDS)
async def test_a_field_a_request_does_not_carry_is_a_422_naming_it(
    inprocess: InProcess, path: str, body: Json, field: str
) -> None:
    """One rule for every route (`OpenAIBaseModel`): nothing is submitted, and the answer
    is OpenAI's error naming the field."""
    if field == "colour":
        body = body | {"colour": "red"}
    async with inprocess.owner("strict") as client:
        if path.startswith("/v1/audio/trans"):
            files = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
            r = await client.post(path, files=files, data={**body, "colour": "red"})
        elif path == "/v1/images/edits":
            r = await client.post(path, files=PNG_FILE, data=body)
        else:
            r = await client.post(path, json=body)
    assert r.status_code == 422, r.text
    error = ErrorResponse.model_validate_json(r.content).error
    assert (error.type, error.param) == ("invalid_input", field), r.text
    assert error.message.startswith(f"{field}: ")
    assert inprocess.redis.zcard(keys.owner_jobs("strict")) == 0


async def test_the_files_routes_declare_their_file_objects(document: Json) -> None:
    """`/v1/files` answers OpenAI's file objects where it is OpenAI's files API: the list,
    a file object, an upload with a `purpose` (else mmq's stored-file facts) and a delete
    by file id."""
    files, one = document["paths"]["/v1/files"], document["paths"]["/v1/files/{file_id}"]

    def names(response: Json) -> set[str]:
        schema = response["content"]["application/json"]["schema"]
        refs = schema.get("anyOf") or schema.get("oneOf") or [schema]
        return {ref["$ref"].rsplit("/", 1)[1] for ref in refs}

    assert names(files["get"]["responses"]["200"]) == {"FileList"}
    assert names(files["post"]["responses"]["201"]) == {"UploadedFile", "FileInfo"}
    assert names(one["get"]["responses"]["200"]) == {"OpenAIFile"}
    assert "*/*" in one["get"]["responses"]["200"]["content"]  # a storage key's bytes
    assert names(document["paths"]["/v1/files/{key}"]["delete"]["responses"]["200"]) == {
        "FileDeleted"
    }
    for name in ("FileList", "UploadedFile", "OpenAIFile", "FileDeleted"):
        assert _component(document, {"$ref": f"#/components/schemas/{name}"})["properties"]
