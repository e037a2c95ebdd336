"""A small Python client for the mmq API, sync (`Client`) and async (`AsyncClient`).

```python
from mmq.client import Client

with Client("http://127.0.0.1:8000", api_key="mmq_…") as mmq:
    job = mmq.submit("tts", {"text": "Hello there."})
    for event in mmq.events(job["id"]):   # resumes by itself after a dropped connection
        print(event["type"], event["data"])
    print(mmq.get(job["id"])["output"])
```
"""

from __future__ import annotations

import asyncio
import json
import mimetypes
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack
from urllib.parse import quote

import httpx

from common.sse import SseMessage, aparse_lines, parse_lines
from jobs.outputs import StoredFile
from jobs.states import TERMINAL_VALUES, ends_job
from jobs.wire import Event, Job, JobRequest

if TYPE_CHECKING:
    from pydantic import JsonValue


class MmqAPIError(Exception):
    """An error answer of the API: `status`, `type`, `message`, `param`."""

    def __init__(self, status: int, body: JsonValue) -> None:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            error = {}  # not the API's error format: a proxy's answer
        param = error.get("param")
        self.status = status
        self.type = str(error.get("type", "http_error"))
        self.param = param if isinstance(param, str) else None
        self.message = str(error.get("message", body))
        super().__init__(f"{status} {self.type}: {self.message}")


def _check(response: httpx.Response) -> None:
    """Raise MmqAPIError for an error answer."""
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"message": response.text}}
        raise MmqAPIError(response.status_code, body)


def _job(response: httpx.Response) -> Job:
    _check(response)
    job: Job = response.json()
    return job


class Deadline(TypedDict, total=False):
    """A job's deadline fields (see `JobCreate`): unset ones are not sent."""

    deadline: float | str | None
    """Unix seconds, or RFC 3339 with a zone."""
    max_queue_s: float | None
    cancel_at_deadline: bool


def _submit_request(
    kind: str,
    input: dict[str, JsonValue],
    priority: str,
    metadata: dict[str, str] | None,
    idempotency_key: str | None,
    wait_s: float | None,
    deadline: Deadline,
) -> tuple[JobRequest, dict[str, str]]:
    body: JobRequest = {"kind": kind, "input": input, "priority": priority}
    if metadata:
        body["metadata"] = metadata
    # A field that is None, 0 or False is not sent.
    if (at := deadline.get("deadline")) is not None and at != 0:
        body["deadline"] = at
    if (max_queue_s := deadline.get("max_queue_s")) is not None and max_queue_s != 0:
        body["max_queue_s"] = max_queue_s
    if deadline.get("cancel_at_deadline"):
        body["cancel_at_deadline"] = True
    headers = {}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    if wait_s is not None:
        headers["Prefer"] = f"wait={wait_s:g}"
    return body, headers


def _event(message: SseMessage) -> Event:
    event: Event = json.loads(message.data)
    return event


def _is_end(event: Event) -> bool:
    return ends_job(event["type"], event["data"])


def _prefer_wait(deadline: float | None, step_s: float) -> dict[str, str]:
    left = step_s if deadline is None else min(step_s, deadline - time.monotonic())
    return {"Prefer": f"wait={max(0.0, left):g}"}


def _waited_enough(job: Job, deadline: float | None) -> bool:
    ended = job["status"] in TERMINAL_VALUES
    return ended or (deadline is not None and time.monotonic() >= deadline)


def _file_path(key: str) -> str:
    return f"/v1/files/{quote(key, safe='/')}"


def _content(response: httpx.Response) -> bytes:
    if response.status_code >= 400:
        _check(response)
    return response.content


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class Client:
    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def submit(
        self, kind: str, input: dict[str, JsonValue], *, priority: str = "normal",
        metadata: dict[str, str] | None = None, idempotency_key: str | None = None,
        wait_s: float | None = None, **deadline: Unpack[Deadline],
    ) -> Job:  # fmt: skip
        body, headers = _submit_request(
            kind, input, priority, metadata, idempotency_key, wait_s, deadline
        )
        return _job(self.http.post("/v1/jobs", json=body, headers=headers))

    def get(self, job_id: str) -> Job:
        return _job(self.http.get(f"/v1/jobs/{job_id}"))

    def wait(self, job_id: str, timeout_s: float | None = None, step_s: float = 20) -> Job:
        """The job once it has ended (or as it is when `timeout_s` runs out)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            headers = _prefer_wait(deadline, step_s)
            job = _job(self.http.get(f"/v1/jobs/{job_id}", headers=headers))
            if _waited_enough(job, deadline):
                return job

    def cancel(self, job_id: str) -> Job:
        return _job(self.http.post(f"/v1/jobs/{job_id}/cancel"))

    def download(self, key: str) -> bytes:
        """A stored file's bytes (an output's `key`), through the API with this client's key."""
        return _content(self.http.get(_file_path(key)))

    def upload(self, path: str | Path) -> StoredFile:
        """Upload a local file (`POST /v1/files`); its `key` names it in a job's input."""
        path = Path(path)
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        with path.open("rb") as stream:
            response = self.http.post("/v1/files", files={"file": (path.name, stream, ctype)})
        _check(response)
        stored: StoredFile = response.json()
        return stored

    def events(self, job_id: str, after: str | None = None, *, retries: int = 5) -> Iterator[Event]:
        """Every event of the job after `after`, until it ends; reconnects with
        Last-Event-ID after a dropped connection, so no event is lost or repeated."""
        last, failures = after, 0
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                with self.http.stream(
                    "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _check(response)
                    for message in parse_lines(response.iter_lines()):
                        event = _event(message)
                        last, failures = event["id"], 0
                        yield event
                        if _is_end(event):
                            return
            except (httpx.TransportError, httpx.StreamError):
                failures += 1
                if failures > retries:
                    raise
                time.sleep(min(2.0, 0.1 * 2**failures))


class AsyncClient:
    def __init__(
        self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:  # fmt: skip
        self.http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout_s
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def submit(
        self, kind: str, input: dict[str, JsonValue], *, priority: str = "normal",
        metadata: dict[str, str] | None = None, idempotency_key: str | None = None,
        wait_s: float | None = None, **deadline: Unpack[Deadline],
    ) -> Job:  # fmt: skip
        body, headers = _submit_request(
            kind, input, priority, metadata, idempotency_key, wait_s, deadline
        )
        return _job(await self.http.post("/v1/jobs", json=body, headers=headers))

    async def get(self, job_id: str) -> Job:
        return _job(await self.http.get(f"/v1/jobs/{job_id}"))

    async def wait(self, job_id: str, timeout_s: float | None = None, step_s: float = 20) -> Job:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            headers = _prefer_wait(deadline, step_s)
            job = _job(await self.http.get(f"/v1/jobs/{job_id}", headers=headers))
            if _waited_enough(job, deadline):
                return job

    async def cancel(self, job_id: str) -> Job:
        return _job(await self.http.post(f"/v1/jobs/{job_id}/cancel"))

    async def download(self, key: str) -> bytes:
        return _content(await self.http.get(_file_path(key)))

    async def events(
        self, job_id: str, after: str | None = None, *, retries: int = 5
    ) -> AsyncIterator[Event]:
        last, failures = after, 0
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            try:
                async with self.http.stream(
                    "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=None
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        _check(response)
                    async for message in aparse_lines(response.aiter_lines()):
                        event = _event(message)
                        last, failures = event["id"], 0
                        yield event
                        if _is_end(event):
                            return
            except (httpx.TransportError, httpx.StreamError):
                failures += 1
                if failures > retries:
                    raise
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))
