"""Batch input files for tests: lines in OpenAI's batch shape, and their upload."""

from __future__ import annotations

import json
from typing import Any, TypedDict

import httpx
from pydantic import JsonValue

from jobs.wire import JobRequest


class BatchLine(TypedDict):
    """A line of a batch's input file (`api.openai.batch_lines`)."""

    custom_id: str
    method: str
    url: str
    body: JobRequest


def job_line(custom_id: str, kind: str, **inp: JsonValue) -> BatchLine:
    """A line that submits a job of `kind` (mmq's `/v1/jobs` endpoint)."""
    body: JobRequest = {"kind": kind, "input": inp}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/jobs", "body": body}


def jsonl(lines: list[Any]) -> bytes:
    """The lines as a JSONL file (a `bytes` line goes in as it is: a broken one)."""
    return b"".join(
        (ln if isinstance(ln, bytes) else json.dumps(ln).encode()) + b"\n" for ln in lines
    )


def upload(http: httpx.Client, data: bytes) -> str:
    """Upload a batch input file through mmq's route; returns its OpenAI file id."""
    files = {"file": ("batch.jsonl", data, "application/jsonl")}
    answer = http.post("/v1/files", files=files, data={"purpose": "batch"})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])
