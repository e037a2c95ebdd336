"""What FastAPI's per-request machinery costs on a hot route, against a plain Starlette
route doing the same work by hand (issue 55: "admission without the framework's weight").

    python -m bench.admission [--requests 4000] [--rounds 5] [--out FILE.json]

mmq's real app (`create_app`, its middleware, its route table, its lifespan on a Redis of
its own, auth off) gets two routes beside `POST /v1/chat/completions`, each taking what
that route takes and doing nothing with it:

- `fastapi`: a FastAPI route with the chat route's signature (`Request`, `Owner`, the
  `ChatRequest` body, `Service`, `Deadline`): FastAPI solves the dependencies, reads the
  body, decodes the JSON and validates it;
- `starlette`: a Starlette `Route` whose endpoint does the same by hand, as the plain
  route that serves `/v1/chat/completions` does (`api.plain_routes`): the owner
  (`current_owner`), the body validated from its bytes in one call (`body_of`:
  pydantic's compiled validator, no `json.loads` first), the service and the deadline
  header (`deadline_of`).

Both answer an empty 200 and sit at the same place in the route table (first), behind the
same middleware, so the difference is the framework's own work per request. Requests are
driven in this process through the ASGI interface (no socket, no HTTP parsing: those cost
the same either way), in alternating blocks; the CPU time per request is the process's
(`time.process_time`) over each block. Also timed: matching the chat route's path against
the app's route table, which every request to it pays before anything else: the plain
route is first; `/v1/embeddings`, the FastAPI route after where chat's was, shows what
finding it cost before.

The table gives µs per request for each, the difference, and that difference as a share
of the API's CPU per LLM request (`--api-ms`, from `bench.llm_ceiling`'s fit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from rich.console import Console
from rich.table import Table
from starlette.responses import Response
from starlette.routing import Match, Route

from api.auth import Owner, current_owner
from api.deps import Service, get_state
from api.openai.chat_models import ChatRequest
from api.openai.common import Deadline
from api.plain_routes import body_of, deadline_of
from bench.common import run_meta
from harness.inprocess import inprocess_settings, serve_in_process
from host.redis_server import RedisServer

console = Console(width=140)
DEFAULT_OUT = Path("bench/results/admission.json")
BODY = json.dumps(
    {
        "model": "chat",
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def add_routes(app: FastAPI) -> None:
    """The two measured routes, first in the app's table."""

    async def fastapi_route(
        request: Request, owner: Owner, body: ChatRequest, service: Service, deadline: Deadline
    ) -> Response:
        return Response(b"", status_code=200)

    async def starlette_route(request: Request) -> Response:  # as `api.plain_routes`'
        owner = await current_owner(request)
        body = await body_of(request, ChatRequest)
        service = get_state(request).service
        deadline = deadline_of(request)
        assert owner and body.model and service is not None and deadline == {}
        return Response(b"", status_code=200)

    app.post("/bench/fastapi")(fastapi_route)
    routes = app.router.routes
    fastapi_entry = routes.pop()
    routes.insert(0, fastapi_entry)
    routes.insert(0, Route("/bench/starlette", starlette_route, methods=["POST"]))


async def one_request(app: Callable[..., Awaitable[None]], path: str) -> int:
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"mmq.test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])

    await app(scope, receive, send)
    return status


async def block(app: FastAPI, path: str, requests: int) -> float:
    """CPU µs per request over `requests` requests to `path`."""
    start = time.process_time()
    for _ in range(requests):
        status = await one_request(app, path)
        if status != 200:
            raise RuntimeError(f"{path} answered {status}")
    return (time.process_time() - start) / requests * 1e6


def match_cost(app: FastAPI, path: str, times: int = 2000) -> float:
    """CPU µs to find `path`'s route in the app's table (as Starlette's router does)."""
    scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
    start = time.process_time()
    for _ in range(times):
        for route in app.router.routes:
            if route.matches(scope)[0] is Match.FULL:
                break
    return (time.process_time() - start) / times * 1e6


async def measure(requests: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mmq-bench-admission-") as tmp:
        server = RedisServer(Path(tmp) / "redis", persist=False)
        server.start()
        try:
            settings = inprocess_settings(server.url, Path(tmp) / "data", auth=False)
            async with serve_in_process(settings) as running:
                add_routes(running.app)
                paths = {"fastapi": "/bench/fastapi", "starlette": "/bench/starlette"}
                for path in paths.values():  # warm-up
                    await block(running.app, path, 200)
                samples: dict[str, list[float]] = {name: [] for name in paths}
                for _ in range(rounds):
                    for name, path in paths.items():
                        samples[name].append(await block(running.app, path, requests))
                matched = {
                    path: match_cost(running.app, path)
                    for path in ("/v1/chat/completions", "/v1/embeddings")
                }
                routes = len(running.app.router.routes)
        finally:
            server.stop()
    best = {name: min(values) for name, values in samples.items()}
    return {"samples_us": samples, "best_us": best, "match_us": matched, "routes": routes}


def report(result: dict[str, Any], api_ms: float) -> None:
    best = result["best_us"]
    saved = best["fastapi"] - best["starlette"]
    table = Table(title="Admission: FastAPI route against a plain Starlette route (CPU µs)")
    for col in ("route", "best µs/request", "all blocks"):
        table.add_column(col, justify="right")
    for name, values in result["samples_us"].items():
        table.add_row(name, f"{best[name]:.1f}", ", ".join(f"{v:.0f}" for v in values))
    console.print(table)
    console.print(
        f"difference {saved:.1f} µs per request = {saved / (api_ms * 1000):.1%} of the API's "
        f"{api_ms:.2f} ms per LLM request"
    )
    found = ", ".join(f"{path} {us:.1f} µs" for path, us in result["match_us"].items())
    console.print(f"finding a route among the app's {result['routes']}: {found}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__)
    parser.add_argument("--requests", type=int, default=4000, help="requests per block")
    parser.add_argument("--rounds", type=int, default=5, help="blocks per route")
    parser.add_argument(
        "--api-ms", type=float, default=1.85, help="the API's CPU per LLM request (ms)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.requests, args.rounds))
    report(result, args.api_ms)
    meta = run_meta(requests=args.requests, rounds=args.rounds, api_ms=args.api_ms)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, **result}, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
