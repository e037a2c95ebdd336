"""A client of a deployment's API for one owner's key, as tests and benches use it."""

from __future__ import annotations

import time
from typing import Any

import httpx
import redis
from pydantic import JsonValue

from jobs.wire import Job, JobRequest
from jobstore.api_keys import create_key


class Api:
    """An httpx client for one owner's API key."""

    def __init__(self, base_url: str, key: str | None) -> None:
        self.key = key or ""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=30)

    def submit(self, kind: str, priority: str = "normal", **inp: JsonValue) -> Job:
        body: JobRequest = {"kind": kind, "input": inp, "priority": priority}
        r = self.http.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        return _job(r)

    def get(self, job_id: str) -> Job:
        r = self.http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return _job(r)

    def wait(self, job_id: str, timeout_s: float = 30) -> Job:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = self.http.get(f"/v1/jobs/{job_id}", headers={"Prefer": "wait=5"})
            if r.status_code == 200:
                return _job(r)
        raise TimeoutError(f"job {job_id} did not end in {timeout_s}s")


def _job(answer: httpx.Response) -> Job:
    job: Job = answer.json()
    return job


def new_owner(redis_url: str, base_url: str, name: str) -> Api:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    return Api(base_url, create_key(client, name))


def limited_owner(redis_url: str, base_url: str, **limits: Any) -> Api:
    """A new owner with its own limits (`jobstore.quotas.KeyLimits`: max_queued, requests,
    weight)."""
    from jobstore.quotas import KeyLimits, set_limits

    name = f"k{time.monotonic_ns()}"
    set_limits(redis.Redis.from_url(redis_url, decode_responses=True), name, KeyLimits(**limits))
    return new_owner(redis_url, base_url, name)
