"""The hot routes served as plain Starlette routes (`api.plain_routes`) answer exactly as
their FastAPI routes would: each request below is sent to the app as it runs, then to the
same app with the plain routes taken out (so FastAPI's routes serve it), and the two
answers must be the same: status, error body, headers that matter."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from api import plain_routes
from harness.inprocess import InProcess

pytestmark = pytest.mark.anyio

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TEXT = {"model": "chat", "prompt": "hi", "max_tokens": 4}
ECHO = {"kind": "echo", "input": {"text": "hello"}}

Request = tuple[str, str | bytes | dict[str, Any] | None, dict[str, str]]
"""(path, body: JSON, raw bytes or none, headers)."""

REFUSED: list[Request] = [
    ("/v1/chat/completions", b'{"model": "chat", ', {}),
    ("/v1/chat/completions", b"", {}),
    ("/v1/chat/completions", b"\xff\xfe", {}),
    ("/v1/chat/completions", {**CHAT, "colour": "red"}, {}),
    ("/v1/chat/completions", {"model": "chat"}, {}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": "many"}, {}),
    ("/v1/chat/completions", {**CHAT, "model": "nonesuch"}, {}),
    ("/v1/chat/completions", CHAT, {"X-Request-Timeout": "0"}),
    ("/v1/chat/completions", CHAT, {"X-Request-Timeout": "soon"}),
    ("/v1/chat/completions", CHAT, {"X-Request-Timeout": "1e9"}),
    ("/v1/completions", b"[1, 2", {}),
    ("/v1/completions", {**TEXT, "colour": "red"}, {}),
    ("/v1/completions", {"model": "chat"}, {}),
    ("/v1/jobs", b"{", {}),
    ("/v1/jobs", b"", {}),
    ("/v1/jobs", {"input": {"text": "hello"}}, {}),
    ("/v1/jobs", {"kind": "nonesuch", "input": {}}, {}),
    ("/v1/jobs", {**ECHO, "colour": "red"}, {}),
    ("/v1/jobs", ECHO, {"Idempotency-Key": "k" * 256}),
]


async def _send(client: httpx.AsyncClient, request: Request) -> httpx.Response:
    path, body, headers = request
    if isinstance(body, dict):
        return await client.post(path, json=body, headers=headers)
    content = body if body is not None else b""
    headers = {"Content-Type": "application/json", **headers}
    return await client.post(path, content=content, headers=headers)


def _without_plain_routes(app: FastAPI) -> list[Any]:
    """Take the plain routes out of the app's table; returns the table as it was."""
    before = list(app.router.routes)
    app.router.routes[:] = [r for r in before if r not in plain_routes.ROUTES]
    assert len(app.router.routes) == len(before) - len(plain_routes.ROUTES)
    return before


def _comparable(response: httpx.Response) -> tuple[int, Any, str | None]:
    body = response.json() if response.content else None
    return response.status_code, body, response.headers.get("retry-after")


async def test_the_plain_routes_are_first_and_refuse_as_fastapi_does(inprocess: InProcess) -> None:
    assert inprocess.app.router.routes[: len(plain_routes.ROUTES)] == plain_routes.ROUTES
    async with inprocess.owner("plain") as client:
        plain = [_comparable(await _send(client, request)) for request in REFUSED]
        before = _without_plain_routes(inprocess.app)
        try:
            framework = [_comparable(await _send(client, request)) for request in REFUSED]
        finally:
            inprocess.app.router.routes[:] = before
    for request, mine, theirs in zip(REFUSED, plain, framework, strict=True):
        assert mine == theirs, f"{request[0]} {request[1]!r} {request[2]}"
        assert mine[0] in (413, 422), request  # each is refused, never a 500
    # The refusals name the field: a body's by its path, a header by its name.
    colour = plain[REFUSED.index(("/v1/chat/completions", {**CHAT, "colour": "red"}, {}))]
    assert colour[1]["error"]["param"] == "colour"
    soon = ("/v1/chat/completions", CHAT, {"X-Request-Timeout": "soon"})
    timeout = plain[REFUSED.index(soon)]
    assert timeout[1]["error"]["param"] == "x-request-timeout"


async def test_a_caller_without_a_key_is_refused_before_its_body_is_read(
    inprocess: InProcess,
) -> None:
    async with inprocess.client() as anonymous:
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/jobs"):
            r = await anonymous.post(
                path, content=b"{", headers={"Content-Type": "application/json"}
            )
            assert r.status_code == 401, path


async def test_a_submit_through_the_plain_route_answers_as_before(inprocess: InProcess) -> None:
    async with inprocess.owner("plain") as client:
        mine = await client.post("/v1/jobs", json=ECHO, headers={"Idempotency-Key": "same"})
        again = await client.post("/v1/jobs", json=ECHO, headers={"Idempotency-Key": "same"})
        before = _without_plain_routes(inprocess.app)
        try:
            theirs = await client.post("/v1/jobs", json=ECHO)
        finally:
            inprocess.app.router.routes[:] = before
    assert mine.status_code == theirs.status_code == 202
    assert again.json()["id"] == mine.json()["id"]  # the Idempotency-Key reached the submit
    assert set(mine.json()) == set(theirs.json())
    assert mine.headers["location"].endswith(mine.json()["id"])
    assert (await inprocess_get(inprocess, mine.json()["id"]))["status"] == "queued"


async def inprocess_get(inprocess: InProcess, job_id: str) -> dict[str, Any]:
    async with inprocess.owner("plain") as client:
        r = await client.get(f"/v1/jobs/{job_id}")
    return dict(r.json()) if r.status_code == 200 else {"status": f"http {r.status_code}"}
