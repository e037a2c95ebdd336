"""Every client mistake gets a clear 4xx, never a 500, and enqueues nothing (the API in
this process: a failure shows the route's traceback)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from harness.inprocess import SLEEP_QUEUE_LIMIT, InProcess, inprocess_settings, serve_in_process
from jobs import keys
from tuning.deployment import flush

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with inprocess.owner("mistaken") as client:
        yield client


def _error(r: httpx.Response) -> dict[str, str]:
    return dict(r.json()["error"])


async def _nothing_queued(inprocess: InProcess, api: httpx.AsyncClient) -> None:
    for kind in ("echo", "sleep", "image"):
        assert inprocess.redis.scard(keys.queued(kind)) == 0
    assert [k for k in inprocess.redis.keys("mmq.*") if inprocess.redis.llen(k)] == []
    assert (await api.get("/v1/jobs")).json()["data"] == []


async def test_a_webhook_where_none_are_signed_names_both_settings_a_local_receiver_needs(
    redis_url: str, tmp_path: Path
) -> None:
    flush(redis_url)
    body = {"kind": "echo", "input": {"text": "x"}, "webhook": {"url": "http://h/x"}}
    settings = inprocess_settings(redis_url, tmp_path)  # no webhooks.secret
    async with serve_in_process(settings) as served, served.owner("hooked") as api:
        r = await api.post("/v1/jobs", json=body)
    assert r.status_code == 422 and _error(r)["param"] == "webhook", r.text
    message = _error(r)["message"]
    assert "MMQ_WEBHOOKS__SECRET" in message and "MMQ_NET__ALLOW_PRIVATE_ADDRESSES" in message
    assert served.redis.scard(keys.queued("echo")) == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"kind": "teleport", "input": {}}, "kind"),
        ({"kind": "echo", "input": {"text": "x"}, "colour": "red"}, "colour"),
        ({"kind": "echo", "input": {"text": "x", "colour": "red"}}, "input.colour"),
        ({"kind": "echo", "input": {"text": 5}}, "input.text"),
        ({"kind": "echo", "input": {}}, "input.text"),
        ({"kind": "echo", "input": {"text": "x"}, "priority": "urgent"}, "priority"),
        ({"kind": "echo", "input": "text"}, "input"),
        ({"input": {"text": "x"}}, "kind"),
        ({"kind": "echo", "input": {"text": "x", "model": "gpt-9"}}, "input.model"),
        ({"kind": "image", "input": {"prompt": "a cat", "width": 4096}}, "input.width"),
        ({"kind": "image", "input": {"prompt": "a cat", "width": 100}}, "input.width"),
        ({"kind": "image", "input": {"prompt": "a cat", "steps": 1000}}, "input.steps"),
        ({"kind": "image", "input": {"prompt": "a cat", "n": 50}}, "input.n"),
        ({"kind": "tts", "input": {"text": "x" * 6000}}, "input.text"),
        ({"kind": "tts", "input": {"text": "   "}}, "input.text"),
        ({"kind": "llm", "input": {"prompt": "hi", "max_tokens": 10**6}}, "input.max_tokens"),
        ({"kind": "llm", "input": {"messages": []}}, "input.messages"),
        ({"kind": "llm", "input": {"prompt": ""}}, "input.prompt"),
        ({"kind": "asr", "input": {"audio": "k", "beam_size": 0}}, "input.beam_size"),
        ({"kind": "tts", "input": {"text": "hello"}}, "kind"),
    ],
)
async def test_invalid_bodies_get_422_naming_the_field(
    inprocess: InProcess, api: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    r = await api.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    error = _error(r)
    assert error["param"] == param
    assert error["message"]
    await _nothing_queued(inprocess, api)


async def test_malformed_json_is_422(api: httpx.AsyncClient) -> None:
    r = await api.post(
        "/v1/jobs",
        content=b'{"kind": "echo", "input": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert "JSON" in _error(r)["message"] and _error(r)["param"] == "body"  # not "26"


BIG = "1" + "0" * 30
"""10**30: past every integer the store can encode (64 bits)."""


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/jobs", r'{"kind": "echo", "input": {"text": "x"}, "metadata": {"k": "\udfff"}}',
         "metadata.k"),
        ("/v1/jobs", r'{"kind": "echo", "input": {"text": "x"}, "metadata": {"\udfff": "v"}}',
         "metadata"),
        ("/v1/jobs", r'{"kind": "echo", "input": {"text": "a\ud800b"}}', "input.text"),
        ("/v1/jobs", r'{"kind": "tts", "input": {"text": "\uDC00"}}', "input.text"),
        ("/v1/audio/speech", r'{"model": "tts-1", "voice": "v", "input": "\udfff"}', "input"),
        ("/v1/embeddings", r'{"model": "m", "input": ["fine", "\udfff"]}', "input.1"),
        ("/v1/rerank", r'{"query": "q", "documents": ["fine", {"text": "\udfff"}]}',
         "documents.1.text"),
        ("/v1/chat/completions",
         r'{"model": "m", "messages": [{"role": "user", "content": "\udbff"}]}',
         "messages.0.content"),
        ("/v1/jobs", f'{{"kind": "echo", "input": {{"text": "x", "n": {BIG}}}}}', "input.n"),
        ("/v1/chat/completions",
         f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], '
         f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "n", '
         f'"schema": {{"maximum": {BIG}}}}}}}}}',
         "response_format.json_schema.schema.maximum"),
        ("/v1/chat/completions",
         f'{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "seed": -{BIG}}}',
         "seed"),
    ],
)  # fmt: skip
async def test_what_cannot_be_stored_is_422_naming_where_it_is(
    inprocess: InProcess, api: httpx.AsyncClient, path: str, raw: str, param: str
) -> None:
    """A lone UTF-16 surrogate (JSON can spell one; UTF-8 cannot hold it), in a value or
    a key, and an integer past 64 bits, wherever a body holds them: 422, never a 500."""
    r = await api.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert _error(r)["param"] == param, r.text
    await _nothing_queued(inprocess, api)


async def test_a_surrogate_pair_is_text_and_a_64_bit_seed_a_number(
    api: httpx.AsyncClient,
) -> None:
    """The escapes of a character outside the BMP (a pair) are text; an integer in 64 bits
    passes the guard (the field's own bounds judge it)."""
    raw = r'{"kind": "echo", "input": {"text": "\ud83d\ude00"}, "metadata": {"k": "\ud83d\ude00"}}'
    r = await api.post("/v1/jobs", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text
    job = (await api.get(f"/v1/jobs/{r.json()['id']}")).json()
    assert job["input"]["text"] == "\U0001f600" and job["metadata"] == {"k": "\U0001f600"}
    seed = {"kind": "image", "input": {"prompt": "a cat", "seed": 2**63}}
    r = await api.post("/v1/jobs", json=seed)
    assert r.status_code == 422 and _error(r)["param"] == "input.seed", r.text


async def test_metadata_is_bounded(api: httpx.AsyncClient) -> None:
    """Keys up to 64 characters, values up to 512, 32 pairs (a listing of 200 jobs stays
    small)."""
    echo = {"kind": "echo", "input": {"text": "x"}}
    for metadata, param in [
        ({"k": "v" * 513}, "metadata.k"),
        ({"k" * 65: "v"}, "metadata"),
        ({"": "v"}, "metadata"),
        ({f"k{i}": "v" for i in range(33)}, "metadata"),
    ]:
        r = await api.post("/v1/jobs", json={**echo, "metadata": metadata})
        assert r.status_code == 422, r.text
        assert _error(r)["param"].startswith(param), r.text
    fits = {f"k{i:02d}" + "k" * 61: "v" * 512 for i in range(32)}
    assert (await api.post("/v1/jobs", json={**echo, "metadata": fits})).status_code == 202


async def test_admin_limits_are_bounded(inprocess: InProcess) -> None:
    from jobstore.api_keys import create_key

    create_key(inprocess.redis, "bob")  # limits are set for an owner that a key names
    async with inprocess.client(create_key(inprocess.redis, "boss", admin=True)) as admin:
        for body, param in [
            ({"max_queued": 10**30}, "max_queued"),
            ({"max_queued": 2**63}, "max_queued"),
            ({"requests": 2**53}, "requests"),
            ({"costs": {"llm": 10**30}}, "costs"),
            ({"costs": {"llm": -1}}, "costs"),
        ]:
            r = await admin.put("/v1/admin/limits/bob", json=body)
            assert r.status_code == 422, (body, r.text)
            assert _error(r)["param"].startswith(param), r.text
        r = await admin.put("/v1/admin/limits/bob", json={"max_queued": 2**53 - 1})
        assert r.status_code == 200 and r.json()["max_queued"] == 2**53 - 1


async def test_bad_query_parameters_are_422_naming_them(api: httpx.AsyncClient) -> None:
    bad = await api.get("/v1/jobs", params={"cursor": "not-a-cursor"})
    assert bad.status_code == 422 and _error(bad)["param"] == "cursor"
    for param, value in [("limit", "0"), ("status", "sleeping")]:
        r = await api.get("/v1/jobs", params={param: value})
        assert r.status_code == 422 and _error(r)["param"] == param, r.text
    job = (await api.post("/v1/jobs", json={"kind": "echo", "input": {"text": "x"}})).json()
    r = await api.get(f"/v1/jobs/{job['id']}/events", params={"after": "nonsense"})
    assert r.status_code == 422 and _error(r)["param"] == "after"


async def test_body_over_the_limit_is_413(inprocess: InProcess, api: httpx.AsyncClient) -> None:
    big = json.dumps({"kind": "echo", "input": {"text": "x" * 2_000_000}})
    r = await api.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert _error(r) == {
        "type": "too_large",
        "message": "request body is over the limit of 1048576 bytes",
        "param": "body",
    }

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
        yield b'{"kind": "echo", "input": {"text": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}}'

    r = await api.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and _error(r)["type"] == "too_large"
    await _nothing_queued(inprocess, api)


async def test_unknown_job_is_404_and_unknown_route_is_json(api: httpx.AsyncClient) -> None:
    r = await api.get("/v1/jobs/job_doesnotexist")
    assert r.status_code == 404 and _error(r)["type"] == "not_found"
    r = await api.get("/v1/nothing")
    assert r.status_code == 404 and _error(r)["type"] == "not_found"


async def test_full_queue_answers_429_with_retry_after(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    """Nothing drains the queue here: the first jobs fill it, the next one is refused."""
    sleep = {"kind": "sleep", "input": {"steps": 1, "step_ms": 1}}
    for _ in range(SLEEP_QUEUE_LIMIT):
        assert (await api.post("/v1/jobs", json=sleep)).status_code == 202
    before = inprocess.redis.llen("mmq.sleep")
    r = await api.post("/v1/jobs", json=sleep)
    assert r.status_code == 429
    assert r.headers["Retry-After"] == str(inprocess.settings.api.retry_after_s)
    assert _error(r)["type"] == "queue_full"
    assert inprocess.redis.llen("mmq.sleep") == before
    assert len((await api.get("/v1/jobs")).json()["data"]) == SLEEP_QUEUE_LIMIT
    # Other kinds have their own limit; a canceled job leaves room in its queue.
    assert (await api.post("/v1/jobs", json={"kind": "echo", "input": {"text": "x"}})).is_success
    queued = (await api.get("/v1/jobs", params={"kind": "sleep"})).json()["data"][0]
    assert (await api.post(f"/v1/jobs/{queued['id']}/cancel")).status_code == 200
    assert (await api.post("/v1/jobs", json=sleep)).status_code == 202


async def test_private_webhook_is_422_where_not_allowed(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    body = {
        "kind": "echo",
        "input": {"text": "x"},
        "webhook": {"url": "http://127.0.0.1:9/hook"},
    }
    r = await api.post("/v1/jobs", json=body)
    assert r.status_code == 422
    assert _error(r)["param"] == "webhook.url"
    assert "127.0.0.1, a loopback address" in _error(r)["message"]
    assert "MMQ_NET__ALLOW_PRIVATE_ADDRESSES=true" in _error(r)["message"]  # what would allow it
    bad_events = {**body, "webhook": {"url": "https://example.com/h", "events": ["nope"]}}
    r = await api.post("/v1/jobs", json=bad_events)
    assert r.status_code == 422 and _error(r)["param"] == "webhook.events"
    await _nothing_queued(inprocess, api)


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": []}, "messages"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "x"}]}, "messages.0.role"),
        ("/v1/completions", {"model": "m", "prompt": ["a", "b"]}, "prompt"),
        ("/v1/images/generations", {"prompt": "a cat", "size": "big"}, "size"),
        ("/v1/images/generations", {"prompt": "a cat", "colour": "red"}, "colour"),
        ("/v1/images/generations", {"prompt": "a cat", "quality": "hd"}, "quality"),
        ("/v1/images/generations", {"prompt": "a cat", "style": "vivid"}, "style"),
        ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy"}, "input"),
        ("/v1/rerank", {"query": "q", "documents": [{"text": 1}]}, "documents.0.text"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["t"]}, "rank_fields"),
    ],
)
async def test_openai_routes_name_the_field_as_their_request_does(
    inprocess: InProcess, api: httpx.AsyncClient, path: str, body: dict[str, object], param: str
) -> None:
    r = await api.post(path, json=body)
    assert r.status_code == 422, r.text
    assert _error(r)["param"] == param
    await _nothing_queued(inprocess, api)


_USER = {"role": "user", "content": "Hi"}
_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("path", "extra", "param", "why"),
    [
        ("/v1/chat/completions", {"tools": [_TOOL], "tool_choice": "required"},
         "tool_choice", "engine (transformers) does not support tool_choice"),
        ("/v1/chat/completions", {"tools": [_TOOL], "parallel_tool_calls": False},
         "parallel_tool_calls", "(transformers) does not support tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}},
         "response_format", "(transformers) does not support structured output"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "logprobs", "log prob"),
        ("/v1/chat/completions", {"n": 2}, "n", "several choices"),
        ("/v1/chat/completions", {"presence_penalty": 0.5}, "presence_penalty", "not support"),
        ("/v1/chat/completions", {"functions": [_TOOL["function"]]}, "functions", "send tools"),
        ("/v1/chat/completions", {"guided_json": {}}, "guided_json", "not a field"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": None}]},
         "messages.0", "content is required"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "x", "tool_calls": [_CALL]}]},
         "messages.0", "tool_calls belong to assistant turns"),
        ("/v1/chat/completions",
         {"messages": [_USER, {"role": "tool", "content": "1"}]},
         "messages.1", "names its tool_call_id"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [
             {"type": "text", "text": "What is it?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
         ]}]},
         "messages.0.content.1.image_url.url", "(m) takes no images"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [_IMAGE] * 9}]},
         "messages", "9 images is over the limit of 8 images"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [
             {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
         ]}]},
         "messages.0.content.0.input_audio", "no pipeline serves kind 'asr'"),
        ("/v1/completions", {"prompt": "Once", "logprobs": 9}, "logprobs", "less than or equal"),
        ("/v1/completions", {"prompt": "Once", "logprobs": 1}, "logprobs", "(transformers)"),
        ("/v1/completions", {"prompt": "Once", "echo": True}, "echo", "yet"),
    ],
)  # fmt: skip
async def test_an_openai_field_mmq_does_not_carry_is_refused_by_name(
    inprocess: InProcess,
    api: httpx.AsyncClient,
    path: str,
    extra: dict[str, object],
    param: str,
    why: str,
) -> None:
    """Never a 200 that quietly left out what the client asked for (tools, JSON output,
    log probabilities, images): a 422 naming the field and saying why."""
    body = {"model": "m", "messages": [_USER], **extra}
    if path == "/v1/completions":
        body.pop("messages")
    r = await api.post(path, json=body)
    assert r.status_code == 422, r.text
    assert _error(r)["param"] == param
    assert why in _error(r)["message"]
    await _nothing_queued(inprocess, api)


_EVERYTHING = {
    "messages": [_USER, {"role": "assistant", "tool_calls": [_CALL]},
                 {"role": "tool", "tool_call_id": "c1", "content": "1"}],
    "tools": [_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": False, "response_format": {"type": "json_object"},
    "logprobs": True, "top_logprobs": 2, "n": 3, "presence_penalty": 0.5,
}  # fmt: skip


async def test_what_only_vllm_honours_is_admitted_for_vllm_and_refused_for_transformers(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    """The engine's declared features decide, at submit, before anything is queued."""
    refused = await api.post(
        "/v1/jobs", json={"kind": "llm", "input": {**_EVERYTHING, "model": "m"}}
    )
    assert refused.status_code == 422, refused.text
    assert _error(refused)["param"] == "input.tool_choice"
    assert "(transformers) does not support" in _error(refused)["message"]
    await _nothing_queued(inprocess, api)

    admitted = await api.post(
        "/v1/jobs", json={"kind": "llm", "input": {**_EVERYTHING, "model": "v"}}
    )
    assert admitted.status_code == 202, admitted.text
    job = (await api.get(f"/v1/jobs/{admitted.json()['id']}")).json()
    stored = {k: _set(job["input"][k]) for k in _EVERYTHING if k != "messages"}
    assert stored == {k: v for k, v in _EVERYTHING.items() if k != "messages"}
    assert job["input"]["messages"][1]["tool_calls"] == [_CALL]
    assert job["input"]["messages"][2]["tool_call_id"] == "c1"
    assert (await api.post(f"/v1/jobs/{job['id']}/cancel")).json()["status"] == "canceled"


def _set(value: object) -> object:
    """`value` without the fields left unset (the stored input names every field)."""
    if isinstance(value, dict):
        return {k: _set(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_set(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("form", "param", "why"),
    [
        ({"include[]": "logprobs"}, "include", "log probabilities"),
        ({"chunking_strategy": "auto"}, "chunking_strategy", "chunking"),
        ({"diarize": "true"}, "diarize", "not a field"),
    ],
)
async def test_a_transcription_field_mmq_does_not_carry_is_refused_by_name(
    inprocess: InProcess, api: httpx.AsyncClient, form: dict[str, str], param: str, why: str
) -> None:
    files = {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}
    data = {"model": "whisper-1", "timestamp_granularities[]": "word", **form}
    r = await api.post("/v1/audio/transcriptions", files=files, data=data)
    assert r.status_code == 422, r.text
    assert _error(r)["param"] == param and why in _error(r)["message"]
    await _nothing_queued(inprocess, api)


async def test_speech_instructions_are_refused_not_ignored(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": "Hi", "instructions": "Cheerfully."}
    r = await api.post("/v1/audio/speech", json=body)
    assert r.status_code == 422, r.text
    assert _error(r)["param"] == "instructions" and "instructions" in _error(r)["message"]
    await _nothing_queued(inprocess, api)


async def test_nesting_is_measured_outside_strings(api: httpx.AsyncClient) -> None:
    """Brackets inside a string (escaped quotes and backslashes too) are text; a body
    nested just within `api.max_json_depth` (64) passes the guard, one past it is 422."""
    text = '[[[[\\"{{{{\\\\' * 50
    within: object = text
    for _ in range(63):  # with the body's object: 64 levels
        within = [within]
    r = await api.post("/v1/jobs", json={"kind": "echo", "input": {"text": "x"}, "m": within})
    assert r.status_code == 422 and "max_json_depth" not in r.text, r.text  # `m`: no field
    r = await api.post("/v1/jobs", json={"kind": "echo", "input": {"text": "x"}, "m": [within] * 4})
    assert r.status_code == 422 and _error(r)["param"] == "m" + ".0" * 63, r.text
    assert "api.max_json_depth" in _error(r)["message"]
