"""The API in this process, no worker: auth, owners, headers and the OpenAPI document,
and what the routes do for jobs that stay queued (cancel, replay, a client that leaves).
A failure shows the route's traceback."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.types import Message

from common.sse import parse_lines
from harness.inprocess import (
    BASE_URL,
    MAX_WAIT_S,
    InProcess,
    inprocess_settings,
    serve_in_process,
)
from jobs import keys
from jobs.autoscale_settings import AutoscaleSettings
from jobstore.api_keys import create_key
from tuning.deployment import flush

pytestmark = pytest.mark.anyio

ECHO = {"kind": "echo", "input": {"text": "hello"}}
LONG_CAP_S = 60.0
"""The `patient` API's cap on `Prefer: wait=N`: an answer that did not wait for it comes an
order of magnitude sooner, however busy the machine."""


@pytest.fixture
async def api(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with inprocess.owner("owner-a") as client:
        yield client


@pytest.fixture
async def patient(redis_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an API in this process whose waits are capped at `LONG_CAP_S`
    (flushes Redis: not for a test that also uses `inprocess`)."""
    flush(redis_url)
    settings = inprocess_settings(redis_url, tmp_path)
    api = settings.api.model_copy(update={"max_wait_s": LONG_CAP_S})
    async with (
        serve_in_process(settings.model_copy(update={"api": api})) as served,
        served.owner("patient") as client,
    ):
        yield client


async def _submit(api: httpx.AsyncClient, body: dict[str, Any] = ECHO) -> dict[str, Any]:
    r = await api.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return dict(r.json())


async def test_a_missing_or_unknown_key_is_401_on_every_route(inprocess: InProcess) -> None:
    async with inprocess.client() as anonymous:
        for method, path in [
            ("GET", "/v1/jobs"),
            ("POST", "/v1/jobs"),
            ("GET", "/v1/jobs/job_x"),
            ("POST", "/v1/jobs/job_x/cancel"),
            ("GET", "/v1/jobs/job_x/events"),
            ("GET", "/v1/jobs/job_x/deliveries"),
            ("POST", "/v1/files"),
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/images/generations"),
            ("POST", "/v1/audio/speech"),
            ("POST", "/v1/audio/transcriptions"),
        ]:
            r = await anonymous.request(method, path)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["WWW-Authenticate"] == "Bearer"
            assert r.json()["error"]["type"] == "unauthorized"
    for authorization in ("Bearer nope", "Basic eA==", "Bearer "):
        async with inprocess.client() as client:
            r = await client.get("/v1/jobs", headers={"Authorization": authorization})
            assert r.status_code == 401, authorization


async def test_the_key_is_checked_before_the_body(inprocess: InProcess) -> None:
    async with inprocess.client() as anonymous:
        assert (await anonymous.post("/v1/jobs", json={"kind": 5})).status_code == 401
        r = await anonymous.post("/v1/jobs", json=ECHO, headers={"Idempotency-Key": "k" * 300})
        assert r.status_code == 401
        assert (await anonymous.post("/v1/chat/completions", json={})).status_code == 401
    assert inprocess.redis.scard(keys.queued("echo")) == 0


async def test_with_auth_off_unknown_keys_act_as_the_anonymous_owner(
    redis_url: str, tmp_path: Path
) -> None:
    """Auth off (loopback only): clients that always send a key (the openai client) work,
    and their jobs are the anonymous owner's; a real key still scopes its own jobs; an mmq
    key that is not known (a typo) gets 401, never the anonymous admin."""
    flush(redis_url)
    settings = inprocess_settings(redis_url, tmp_path, auth=False)
    async with (
        serve_in_process(settings) as served,
        served.client() as none,
        served.client("sk-anything") as made_up,
        served.owner("keyed") as keyed,
    ):
        job = await _submit(made_up)
        assert (await none.get(f"/v1/jobs/{job['id']}")).status_code == 200
        assert (await keyed.get(f"/v1/jobs/{job['id']}")).status_code == 404
        basic = await made_up.get("/v1/jobs", headers={"Authorization": "Basic eA=="})
        assert basic.status_code == 401
        typo = {"Authorization": "Bearer mmq_wrong"}
        for method, path in [("GET", "/v1/whoami"), ("POST", "/v1/jobs")]:
            r = await none.request(method, path, headers=typo, json={"kind": "echo", "input": {}})
            assert r.status_code == 401 and r.json()["error"]["message"] == "unknown API key"


async def test_another_owners_job_is_404_everywhere(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    job = await _submit(api)
    async with inprocess.owner("intruder") as other:
        for method, path in [
            ("GET", f"/v1/jobs/{job['id']}"),
            ("POST", f"/v1/jobs/{job['id']}/cancel"),
            ("GET", f"/v1/jobs/{job['id']}/events"),
            ("GET", f"/v1/jobs/{job['id']}/deliveries"),
        ]:
            r = await other.request(method, path)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["type"] == "not_found"
        r = await other.get(f"/v1/jobs/{job['id']}", headers={"Prefer": "wait=1"})
        assert r.status_code == 404
        assert (await other.get("/v1/jobs")).json()["data"] == []
    assert (await api.get(f"/v1/jobs/{job['id']}")).json()["status"] == "queued"


@pytest.mark.parametrize(
    ("prefer", "applied"),
    [
        ("wait=0.2", "wait=0.2"),
        ("respond-async, wait=0.3", "wait=0.3"),
        ("wait = 0.25", "wait=0.25"),
        ("return=minimal; wait=0", "wait=0"),
        ("handling=strict", None),
        ("wait=soon", None),
        ("", None),
    ],
)
async def test_prefer_wait_is_parsed_and_applied(
    patient: httpx.AsyncClient, prefer: str, applied: str | None
) -> None:
    """The wait asked is the wait applied: at least that long, and (the job stays queued)
    it runs out well before the cap, a minute, that a misread wait could run to."""
    job = await _submit(patient)
    waited_s = float(applied.removeprefix("wait=")) if applied else 0.0
    started = time.monotonic()
    r = await patient.get(f"/v1/jobs/{job['id']}", headers={"Prefer": prefer})
    assert waited_s <= time.monotonic() - started < LONG_CAP_S / 6
    assert r.headers.get("Preference-Applied") == applied
    # A wait that runs out answers 202 with the job as it is; without a wait, 200.
    assert r.status_code == (202 if applied else 200)
    assert r.json()["status"] == "queued"
    assert r.headers["Location"] == f"{r.json()['urls']['self']}"


async def test_prefer_wait_on_submit_and_its_cap(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    started = time.monotonic()
    r = await api.post("/v1/jobs", json=ECHO, headers={"Prefer": "wait=0.2"})
    assert r.status_code == 202 and r.headers["Preference-Applied"] == "wait=0.2"
    assert r.json()["status"] == "queued"
    assert time.monotonic() - started >= 0.2
    started = time.monotonic()
    r = await api.get(f"/v1/jobs/{r.json()['id']}", headers={"Prefer": "wait=100"})
    # The cap (1 s here) ends it, an order of magnitude before the 100 s asked.
    assert MAX_WAIT_S <= time.monotonic() - started < 10
    assert r.status_code == 202 and r.headers["Preference-Applied"] == "wait=100"


async def test_a_job_that_has_ended_answers_a_wait_at_once(patient: httpx.AsyncClient) -> None:
    """With 200 and the job, well before the wait asked (the cap, a minute) runs out."""
    job = await _submit(patient)
    assert (await patient.post(f"/v1/jobs/{job['id']}/cancel")).status_code == 200
    started = time.monotonic()
    r = await patient.get(f"/v1/jobs/{job['id']}", headers={"Prefer": f"wait={LONG_CAP_S:g}"})
    assert r.status_code == 200 and r.json()["status"] == "canceled"
    assert r.headers["Preference-Applied"] == f"wait={LONG_CAP_S:g}"
    assert time.monotonic() - started < LONG_CAP_S / 6


async def test_openapi_documents_the_headers(api: httpx.AsyncClient) -> None:
    schema = (await api.get("/openapi.json")).json()
    submit = schema["paths"]["/v1/jobs"]["post"]
    headers = {p["name"]: p for p in submit["parameters"] if p["in"] == "header"}
    assert set(headers) == {"Prefer", "Idempotency-Key"}
    assert headers["Idempotency-Key"]["schema"] == {
        "type": "string",
        "maxLength": 255,
        "title": "Idempotency-Key",
        "description": "A repeated submit with the same key returns the same job.",
    }
    assert "wait=N" in headers["Prefer"]["description"]
    assert "JobCreate_echo" in str(submit["requestBody"])
    get = schema["paths"]["/v1/jobs/{job_id}"]["get"]
    assert {p["name"] for p in get["parameters"] if p["in"] == "header"} == {"Prefer"}
    await _docs_pages_load_from_this_install(api)


async def _docs_pages_load_from_this_install(api: httpx.AsyncClient) -> None:
    """`/docs` and `/redoc` load every script and style from the API itself (air-gapped
    hosts reach no CDN), and those are served."""
    for page in ("/docs", "/redoc"):
        r = await api.get(page)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        assert "cdn." not in r.text and "fonts.googleapis" not in r.text, r.text
        assets = re.findall(r'(?:src|href)="(/docs/assets/[^"]+)"', r.text)
        assert any(a.endswith(".js") for a in assets), r.text
        for asset in assets:
            got = await api.get(asset)
            assert got.status_code == 200 and len(got.content) > 1000, asset


async def test_idempotency_key_is_checked_and_keeps_one_job(
    inprocess: InProcess, api: httpx.AsyncClient
) -> None:
    r = await api.post("/v1/jobs", json=ECHO, headers={"Idempotency-Key": "k" * 256})
    assert r.status_code == 422 and r.json()["error"]["param"] == "Idempotency-Key"
    headers = {"Idempotency-Key": "k" * 255}
    first = await api.post("/v1/jobs", json=ECHO, headers=headers)
    again = await api.post("/v1/jobs", json=ECHO, headers=headers)
    assert first.status_code == 202 and again.status_code == 202  # still queued
    assert first.json()["id"] == again.json()["id"]
    other = {"kind": "echo", "input": {"text": "other"}}
    changed = await api.post("/v1/jobs", json=other, headers=headers)
    assert changed.status_code == 422 and changed.json()["error"]["param"] == "Idempotency-Key"
    assert [j["id"] for j in (await api.get("/v1/jobs")).json()["data"]] == [first.json()["id"]]
    assert inprocess.redis.scard(keys.queued("echo")) == 1


async def test_list_pages_with_a_cursor(api: httpx.AsyncClient) -> None:
    ids = [
        (await _submit(api, {"kind": "echo", "input": {"text": f"n{i}"}}))["id"] for i in range(5)
    ]
    seen: list[str] = []
    params: dict[str, Any] = {"limit": 2}
    while True:
        page = (await api.get("/v1/jobs", params=params)).json()
        seen += [j["id"] for j in page["data"]]
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert seen == list(reversed(ids))
    assert (await api.get("/v1/jobs", params={"status": "succeeded"})).json()["data"] == []


async def test_a_canceled_queued_job_replays_its_events(api: httpx.AsyncClient) -> None:
    job = await _submit(api)
    r = await api.post(f"/v1/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "canceled"
    again = await api.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["type"] == "conflict"
    r = await api.get(f"/v1/jobs/{job['id']}/events")
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(m.data) for m in parse_lines(iter(r.text.splitlines()))]
    assert [e["data"]["status"] for e in events] == ["queued", "canceled"]
    r = await api.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": events[0]["id"]})
    assert [json.loads(m.data)["id"] for m in parse_lines(iter(r.text.splitlines()))] == [
        events[1]["id"]
    ]


async def test_a_client_that_leaves_a_waiting_openai_request_cancels_its_job(
    inprocess: InProcess,
) -> None:
    """`POST /v1/images/generations` answers once the job ends; nothing runs it here, so
    the request waits until its client goes away (`http.disconnect`, as a server sends
    it), and then the job is canceled."""
    key = create_key(inprocess.redis, "leaver")
    body = json.dumps({"prompt": "a cat", "size": "64x64"}).encode()
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    left = anyio.Event()
    sent: list[Message] = []

    async def receive() -> Message:
        if pending:
            return pending.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = _http_scope("POST", "/v1/images/generations", key, len(body))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(inprocess.app, scope, receive, send)
        job_id = await _first_job_of(inprocess, "leaver")
        await anyio.sleep(0.3)
        assert sent == []  # still waiting for the job's end
        async with inprocess.client(key) as api:
            assert (await api.get(f"/v1/jobs/{job_id}")).json()["status"] == "queued"
            left.set()
            with anyio.fail_after(5):
                while (await api.get(f"/v1/jobs/{job_id}")).json()["status"] != "canceled":
                    await anyio.sleep(0.02)


def _http_scope(method: str, path: str, key: str, length: int) -> dict[str, Any]:
    headers = [
        (b"host", BASE_URL.removeprefix("http://").encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(length).encode()),
        (b"authorization", f"Bearer {key}".encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("mmq.test", 80),
    }


async def _first_job_of(inprocess: InProcess, owner: str) -> str:
    with anyio.fail_after(5):
        while not (ids := inprocess.redis.zrange(keys.owner_jobs(owner), 0, 0)):
            await anyio.sleep(0.02)
    return str(ids[0])


async def test_readiness_names_kinds_without_a_worker_and_metrics_answer(
    api: httpx.AsyncClient,
) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    r = await api.get("/readyz")
    assert r.status_code == 503
    assert r.json() == {
        "status": "unavailable",
        "missing": [f"worker for kind {k}" for k in ("echo", "image", "llm", "sleep")],
        "no_workers": ["chat", "chat-vllm", "echo", "img", "sleep"],
    }
    await _submit(api)
    metrics = await api.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'mmq_jobs_queued{kind="echo"} 1.0' in metrics.text


async def test_ready_without_workers_where_they_scale_to_zero(
    redis_url: str, tmp_path: Path
) -> None:
    """`autoscale.ready_without_workers`: the API is ready with no worker at all, names
    the pipelines without one, and takes their jobs, which wait queued."""
    flush(redis_url)
    settings = inprocess_settings(redis_url, tmp_path)
    scaled = settings.model_copy(
        update={"autoscale": AutoscaleSettings(ready_without_workers=True)}
    )
    async with serve_in_process(scaled) as served, served.owner("zero") as client:
        r = await client.get("/readyz")
        assert r.status_code == 200, r.text
        assert r.json()["no_workers"] == ["chat", "chat-vllm", "echo", "img", "sleep"]
        job = await _submit(client)
        assert job["status"] == "queued"
        assert (await client.get(f"/v1/jobs/{job['id']}")).json()["status"] == "queued"
        metrics = (await client.get("/metrics")).text
        for line in (
            'mmq_pipeline_jobs_waiting{pipeline="echo"} 1.0',
            'mmq_pipeline_slots_live{pipeline="echo"} 0.0',
            'mmq_pipeline_desired_workers{pipeline="echo"} 1.0',  # no service time yet
            'mmq_pipeline_desired_workers{pipeline="sleep"} 0.0',
        ):
            assert line in metrics, metrics
