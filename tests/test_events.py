"""Event streams (SSE and websocket) against a real deployment: replay, resume, follow."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from common.sse import parse_lines
from harness.api_client import Api, new_owner
from mmq.client import AsyncClient, Client, MmqAPIError
from tuning.deployment import Deployment


@pytest.fixture
def client(deployment: Deployment, api: Api) -> Client:
    return Client(deployment.base_url, api.key)


def _statuses(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["status"] for e in events if e["type"] == "status"]


def test_sse_replays_then_follows_live_until_the_end(client: Client) -> None:
    job = client.submit("sleep", {"steps": 5, "step_ms": 100})
    events = list(client.events(job["id"]))
    assert _statuses(events) == ["queued", "running", "succeeded"]
    assert [e["data"]["step"] for e in events if e["type"] == "progress"] == [1, 2, 3, 4, 5]
    assert [e["type"] for e in events][-2:] == ["output", "status"]
    ids = [e["id"] for e in events]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert all(e["job_id"] == job["id"] and e["ts"] > 0 for e in events)
    # An ended job's stream replays in full and closes.
    assert [e["id"] for e in client.events(job["id"])] == ids


def test_sse_wire_format_and_keepalive(deployment: Deployment, api: Api) -> None:
    job = api.submit("sleep", steps=2, step_ms=1200)
    lines: list[str] = []
    with api.http.stream("GET", f"/v1/jobs/{job['id']}/events", timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = list(r.iter_lines())
    assert ": keep-alive" in lines
    messages = list(parse_lines(iter(lines)))
    assert messages[0].event == "status" and messages[0].id
    assert all(m.id == json.loads(m.data)["id"] for m in messages)
    assert messages[-1].event == "status"
    assert json.loads(messages[-1].data)["data"]["status"] == "succeeded"


def test_a_dropped_client_resumes_with_last_event_id_exactly_once(client: Client) -> None:
    job = client.submit("sleep", {"steps": 8, "step_ms": 80})
    first: list[dict[str, Any]] = []
    for event in client.events(job["id"]):
        first.append(event)
        if len(first) == 3:
            break  # the connection drops here
    rest = list(client.events(job["id"], after=first[-1]["id"]))
    everything = list(client.events(job["id"]))
    assert [e["id"] for e in first + rest] == [e["id"] for e in everything]
    assert _statuses(everything)[-1] == "succeeded"
    with client.http.stream(
        "GET", f"/v1/jobs/{job['id']}/events", params={"after": first[-1]["id"]}
    ) as r:
        by_query = [json.loads(m.data)["id"] for m in parse_lines(r.iter_lines())]
    assert by_query == [e["id"] for e in rest]


def test_async_client_follows_and_waits(deployment: Deployment, api: Api) -> None:
    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with AsyncClient(deployment.base_url, api.key) as aclient:
            job = await aclient.submit("echo", {"text": "async"})
            events = [e async for e in aclient.events(job["id"])]
            return events, await aclient.wait(job["id"], timeout_s=10)

    events, job = asyncio.run(main())
    assert _statuses(events) == ["queued", "running", "succeeded"]
    assert job["output"]["text"] == "async"
    assert any(e["type"] == "partial" for e in events)


def test_websocket_streams_events_and_takes_a_cancel(deployment: Deployment, api: Api) -> None:
    ws_base = deployment.base_url.replace("http://", "ws://")
    job = api.submit("sleep", steps=200, step_ms=25)
    url = f"{ws_base}/v1/jobs/{job['id']}/ws"
    received: list[dict[str, Any]] = []
    with connect(url, additional_headers={"Authorization": f"Bearer {api.key}"}) as ws:
        while True:
            event = json.loads(ws.recv(timeout=20))
            received.append(event)
            if event["type"] == "progress" and event["data"]["step"] == 3:
                ws.send(json.dumps({"type": "cancel"}))
            if event["type"] == "status" and event["data"]["status"] == "canceled":
                break
    assert _statuses(received)[0] == "queued"
    assert api.get(job["id"])["status"] == "canceled"
    # Resume with ?after= and the token in the query: only the events after that id.
    after = received[1]["id"]
    with connect(f"{url}?after={after}&token={api.key}") as ws:
        replayed = []
        while True:
            try:
                replayed.append(json.loads(ws.recv(timeout=10))["id"])
            except Exception:
                break
    assert replayed == [e["id"] for e in received[2:]]


def test_streams_are_owner_scoped(deployment: Deployment, api: Api) -> None:
    job = api.submit("echo", text="private")
    other = new_owner(deployment.redis_url, deployment.base_url, f"spy{time.monotonic_ns()}")
    assert other.http.get(f"/v1/jobs/{job['id']}/events").status_code == 404
    assert httpx.get(f"{deployment.base_url}/v1/jobs/{job['id']}/events").status_code == 401
    with pytest.raises(MmqAPIError) as err:
        list(Client(deployment.base_url, other.key).events(job["id"]))
    assert err.value.status == 404
    ws_url = deployment.base_url.replace("http://", "ws://") + f"/v1/jobs/{job['id']}/ws"
    with pytest.raises(InvalidStatus) as denied:
        connect(ws_url, additional_headers={"Authorization": f"Bearer {other.key}"})
    assert denied.value.response.status_code == 404
    with pytest.raises(InvalidStatus) as anonymous:
        connect(ws_url)
    assert anonymous.value.response.status_code == 401
    bad = api.http.get(f"/v1/jobs/{job['id']}/events", params={"after": "nonsense"})
    assert bad.status_code == 422
