"""Every client mistake gets a clear 4xx, never a 500, and enqueues nothing."""

from __future__ import annotations

import json

import pytest
import redis

from jobs import keys
from tests.conftest import Api


def _error(r: object) -> dict[str, str]:
    assert hasattr(r, "json")
    return dict(r.json()["error"])  # type: ignore[attr-defined]


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
        ({"kind": "llm", "input": {"messages": []}}, "input"),
        ({"kind": "asr", "input": {"audio": "k", "beam_size": 0}}, "input.beam_size"),
        ({"kind": "tts", "input": {"text": "hello"}}, "kind"),
    ],
)
def test_invalid_bodies_get_422_naming_the_field(
    api: Api, rclient: redis.Redis, body: dict[str, object], param: str
) -> None:
    before = rclient.llen("mmq.echo")
    r = api.http.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    error = _error(r)
    assert error["param"] == param
    assert error["message"]
    assert rclient.llen("mmq.echo") == before
    assert api.http.get("/v1/jobs").json()["data"] == []


def test_malformed_json_is_422(api: Api) -> None:
    r = api.http.post(
        "/v1/jobs",
        content=b'{"kind": "echo", "input": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert "JSON" in _error(r)["message"]


def test_body_over_the_limit_is_413(api: Api) -> None:
    big = json.dumps({"kind": "echo", "input": {"text": "x" * 2_000_000}})
    r = api.http.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert _error(r)["type"] == "too_large"

    def chunks() -> object:
        yield b'{"kind": "echo", "input": {"text": "'
        for _ in range(40):
            yield b"y" * 65536
        yield b'"}}'

    r = api.http.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_unknown_job_is_404_and_unknown_route_is_json(api: Api) -> None:
    r = api.http.get("/v1/jobs/job_doesnotexist")
    assert r.status_code == 404 and _error(r)["type"] == "not_found"
    assert api.http.get("/v1/nothing").status_code == 404


def test_full_queue_answers_429_with_retry_after(api: Api, rclient: redis.Redis) -> None:
    # Fill the sleep kind's queued set up to the limit configured in this module.
    fillers = [f"job_filler{i}" for i in range(1000)]
    rclient.sadd(keys.queued("sleep"), *fillers)
    try:
        before = rclient.llen("mmq.sleep")
        r = api.http.post("/v1/jobs", json={"kind": "sleep", "input": {}})
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert _error(r)["type"] == "queue_full"
        assert rclient.llen("mmq.sleep") == before
        assert api.http.get("/v1/jobs").json()["data"] == []
    finally:
        rclient.srem(keys.queued("sleep"), *fillers)
    ok = api.http.post("/v1/jobs", json={"kind": "sleep", "input": {"steps": 1, "step_ms": 1}})
    assert ok.status_code == 202


def test_private_webhook_is_422_where_not_allowed(api: Api) -> None:
    body = {
        "kind": "echo",
        "input": {"text": "x"},
        "webhook": {"url": "http://127.0.0.1:9/hook"},
    }
    r = api.http.post("/v1/jobs", json=body)
    assert r.status_code == 422
    assert r.json()["error"]["param"] == "webhook.url"
    bad_events = {**body, "webhook": {"url": "https://example.com/h", "events": ["nope"]}}
    r = api.http.post("/v1/jobs", json=bad_events)
    assert r.status_code == 422 and r.json()["error"]["param"] == "webhook.events"
    assert api.http.get("/v1/jobs").json()["data"] == []
