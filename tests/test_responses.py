"""OpenAI's Responses API end to end (`/v1/responses`), on the session's deployment of every
kind (`kinds_dep`: the tiny Llama on `transformers serve`, real Redis, workers, uvicorn),
with the official client and raw HTTP: answers and their stream, stored responses and
`previous_response_id`, background mode as jobs (polled, resumed with `starting_after`,
canceled, a worker SIGKILLed mid-response), and refusals by name. Tools, `text.format`
and the Agents SDK run on both engines in tests/test_llm_features.py."""

from __future__ import annotations

import json
import signal
import time
from typing import Any, get_args

import httpx
import openai
import pytest
import redis
from openai.types.responses import Response, ResponseStreamEvent

from common.sse import parse_lines
from harness.api_client import Api, new_owner
from tuning.deployment import Deployment, running_on, wait_until

EVENT_MODELS = {
    model.model_fields["type"].annotation.__args__[0]: model  # each event's `type` literal
    for model in get_args(get_args(ResponseStreamEvent)[0])
}
"""The official client's model of each stream event type."""


@pytest.fixture
def api(kinds_dep: Deployment) -> Api:
    return new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"resp{time.monotonic_ns()}")


@pytest.fixture
def oai(kinds_dep: Deployment, api: Api) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kinds_dep.base_url}/v1", api_key=api.key, max_retries=0)


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    """A Responses stream's events, each checked against the official client's model of
    its type, with its `event:` line naming the same type."""
    assert r.status_code == 200, r.text
    events: list[dict[str, Any]] = []
    for frame in r.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "data" not in lines:
            continue
        data = json.loads(lines["data"])
        assert lines.get("event") == data["type"], frame
        EVENT_MODELS[data["type"]].model_validate(data)
        events.append(data)
    return events


def _stream(api: Api, **body: Any) -> list[dict[str, Any]]:
    r = api.http.post("/v1/responses", json={"model": "llm", "stream": True, **body}, timeout=120)
    return _events(r)


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


def _job(api: Api, response_id: str) -> dict[str, Any]:
    job: dict[str, Any] = api.get("job_" + response_id.removeprefix("resp_"))
    return job


def _said(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, content) of each turn of an `llm` job's input."""
    return [(turn["role"], turn["content"]) for turn in job["input"]["messages"]]


def test_the_official_client_gets_a_response_reads_it_back_and_lists_its_input(
    oai: openai.OpenAI, api: Api
) -> None:
    answer = oai.responses.create(
        model="llm", input="Tell me a story.", instructions="Be brief.", max_output_tokens=6,
        temperature=0, metadata={"ticket": "42"},
    )  # fmt: skip
    assert answer.id.startswith("resp_") and answer.object == "response"
    assert answer.status == "incomplete"  # 6 tokens: cut at max_output_tokens
    assert answer.incomplete_details is not None
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert answer.output_text and answer.output[0].type == "message"
    assert answer.usage is not None and answer.usage.output_tokens == 6
    assert (answer.instructions, answer.metadata, answer.temperature) == (
        "Be brief.",
        {"ticket": "42"},
        0,
    )
    # The same job under OpenAI's names: its input is the chat the engine read.
    job = _job(api, answer.id)
    assert _said(job) == [("system", "Be brief."), ("user", "Tell me a story.")]
    assert job["metadata"] == {"ticket": "42"} and job["input"]["max_tokens"] == 6
    again = oai.responses.retrieve(answer.id)
    assert again.output_text == answer.output_text and again.status == "incomplete"
    unstored = oai.responses.create(model="llm", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False and unstored.output_text
    with pytest.raises(openai.NotFoundError):  # answered, and kept nowhere but in its job
        oai.responses.retrieve(unstored.id)
    (item,) = oai.responses.input_items.list(answer.id).data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].type == "input_text" and item.content[0].text == "Tell me a story."


def test_a_streamed_response_sends_its_events_in_order_numbered(api: Api) -> None:
    events = _stream(api, input="Hello there", max_output_tokens=8, temperature=0)
    types = [e["type"] for e in events]
    assert types[:5] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
    ]  # fmt: skip
    assert types[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.incomplete",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert _text(events) == done["text"] and done["text"]
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == done["text"] and final.usage is not None
    # Stored: the same response read back.
    stored = api.http.get(f"/v1/responses/{final.id}").json()
    assert stored["output"] == events[-1]["response"]["output"]


def test_previous_response_id_continues_the_conversation_from_the_store(
    oai: openai.OpenAI, api: Api, kinds_dep: Deployment
) -> None:
    first = oai.responses.create(
        model="llm", input="My name is Ada.", instructions="Only the first turn's.",
        max_output_tokens=4, temperature=0,
    )  # fmt: skip
    second = oai.responses.create(
        model="llm", input="What is my name?", previous_response_id=first.id,
        max_output_tokens=4, temperature=0,
    )  # fmt: skip
    assert second.previous_response_id == first.id
    assert _said(_job(api, second.id)) == [
        ("user", "My name is Ada."),
        ("assistant", first.output_text),
        ("user", "What is my name?"),
    ]  # an earlier response's instructions are not carried on
    third = oai.responses.create(
        model="llm", input="And again?", previous_response_id=second.id, max_output_tokens=2
    )
    assert len(_job(api, third.id)["input"]["messages"]) == 5
    # Another key reads none of it, and continues none of it.
    other = new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"other{time.monotonic_ns()}")
    assert other.http.get(f"/v1/responses/{first.id}").status_code == 404
    assert other.http.get(f"/v1/responses/{first.id}/input_items").status_code == 404
    r = other.http.post(
        "/v1/responses", json={"model": "llm", "input": "Hi", "previous_response_id": first.id}
    )
    assert r.status_code == 422 and r.json()["error"]["param"] == "previous_response_id", r.text
    # Deleted: gone for its key too.
    assert api.http.delete(f"/v1/responses/{first.id}").json()["deleted"] is True
    assert api.http.get(f"/v1/responses/{first.id}").status_code == 404
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)


def test_a_background_response_is_polled_and_its_stream_resumed_where_it_was(
    oai: openai.OpenAI, api: Api
) -> None:
    queued = oai.responses.create(
        model="llm", input="Count to ten.", background=True, max_output_tokens=24,
        service_tier="priority",
    )  # fmt: skip
    assert queued.status in ("queued", "in_progress") and queued.background is True
    assert _job(api, queued.id)["priority"] == "high"

    def ended() -> bool:
        return oai.responses.retrieve(queued.id).status in ("completed", "incomplete")

    wait_until(ended, timeout_s=120)
    url = f"/v1/responses/{queued.id}"
    whole = _events(api.http.get(url, params={"stream": "true"}, timeout=60))
    assert whole[0]["type"] == "response.created"
    assert whole[0]["response"]["status"] == "queued" and whole[1]["type"] == "response.queued"
    assert whole[-1]["type"] == "response.incomplete"
    cut = len(whole) // 2
    rest = _events(api.http.get(url, params={"stream": "true", "starting_after": cut}, timeout=60))
    assert rest == whole[cut + 1 :]
    done = oai.responses.retrieve(queued.id)
    assert _text(whole) == done.output_text
    # A job like any other: its own events say the same.
    with api.http.stream("GET", f"/v1/jobs/{done.job_id}/events") as r:  # type: ignore[attr-defined]
        job_events = [json.loads(m.data) for m in parse_lines(r.iter_lines())]
    statuses = [e["data"]["status"] for e in job_events if e["type"] == "status"]
    assert statuses[-1] == "succeeded" and "running" in statuses
    partials = "".join(e["data"].get("text", "") for e in job_events if e["type"] == "partial")
    assert partials == done.output_text


def test_a_background_response_is_canceled_and_only_a_background_one(
    oai: openai.OpenAI, api: Api
) -> None:
    running = oai.responses.create(
        model="llm", input="Write a long essay.", background=True, max_output_tokens=2000
    )
    canceled = oai.responses.cancel(running.id)
    assert canceled.status == "cancelled"
    assert _job(api, running.id)["status"] == "canceled"
    replayed = _events(api.http.get(f"/v1/responses/{running.id}", params={"stream": "true"}))
    assert replayed[-1]["type"] == "response.failed"
    assert replayed[-1]["response"]["status"] == "cancelled"
    with pytest.raises(openai.ConflictError):  # it has ended
        oai.responses.cancel(running.id)
    plain = oai.responses.create(model="llm", input="Hi", max_output_tokens=2)
    r = api.http.post(f"/v1/responses/{plain.id}/cancel")
    assert r.status_code == 422 and r.json()["error"]["param"] == "response_id", r.text


def test_a_worker_killed_mid_response_loses_nothing_and_streams_it_once(
    kinds_dep: Deployment, oai: openai.OpenAI, api: Api
) -> None:
    worker = next(p for p in kinds_dep.procs if p.name.startswith("worker-llm") and p.alive())
    r = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    started = oai.responses.create(
        model="llm", input="Tell me everything.", background=True, max_output_tokens=200,
        temperature=0,
    )  # fmt: skip
    job_id = "job_" + started.id.removeprefix("resp_")

    def streaming() -> bool:
        return (
            job_id in running_on(r, worker)
            and _job(api, started.id)["timings"]["time_to_first_output_ms"] is not None
        )

    wait_until(streaming, worker, timeout_s=120)
    worker.kill(signal.SIGKILL)
    kinds_dep.procs.remove(worker)
    fresh = kinds_dep.spawn(f"worker-llm-{time.monotonic_ns()}", "worker", "--pipeline", "llm")
    wait_until(lambda: oai.responses.retrieve(started.id).status == "incomplete", fresh,
               timeout_s=300)  # fmt: skip
    assert _job(api, started.id)["attempts"] == 2
    done = oai.responses.retrieve(started.id)
    events = _events(api.http.get(f"/v1/responses/{started.id}", params={"stream": "true"}))
    assert _text(events) == done.output_text  # each token once, across both runs
    assert [e["type"] for e in events].count("response.output_item.added") == 1
    assert [e["type"] for e in events][-1] == "response.incomplete"


BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools.0.name"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input.0.content.0.type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"input": [{"type": "function_call_output", "output": "4"}]}, "input.0.call_id"),
    ({"truncation": "auto"}, "truncation"),
    ({"background": True, "store": False}, "background"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"previous_response_id": "resp_nothing"}, "previous_response_id"),
    ({"text": {"format": {"type": "json_object"}}}, "text.format"),
]  # fmt: skip
"""Requests refused by name: built-in tools, what is not served, and (the last) a JSON
format that `transformers serve` would drop."""


@pytest.mark.parametrize(("extra", "field"), BAD)
def test_what_is_not_served_is_refused_by_name_and_submits_nothing(
    kinds_dep: Deployment, api: Api, extra: dict[str, Any], field: str
) -> None:
    body = {"model": "llm", "input": "Hi"} | extra
    r = api.http.post("/v1/responses", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == field, r.text
    assert api.http.get("/v1/jobs", params={"kind": "llm"}).json()["data"] == []
    # Nor is a response kept (one refused at submit, as the last, had its record written).
    store = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    records = [json.loads(store.get(key) or "{}") for key in store.scan_iter("mmq:response:*")]
    owner = api.http.get("/v1/whoami").json()["owner"]
    assert [record for record in records if record.get("owner") == owner] == []
