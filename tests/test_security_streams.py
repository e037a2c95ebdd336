"""Issue 65, completion streams: a chat completion streamed under a key that is revoked
meanwhile ends within seconds with an error chunk that says why, and its job is canceled,
against a real API (uvicorn, auth required, real Redis). No worker runs: the job stays
queued, so the stream stays open on keep-alives until the revocation ends it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from harness.api_client import new_owner
from jobs import keys
from jobstore.api_keys import hash_key, revoke_key
from tuning.deployment import Deployment, flush, serving

pytestmark = pytest.mark.timeout(120)

LLM = """
[pipelines.llm]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = "remote"
[pipelines.llm.options]
engine = "url"
engine_url = "http://127.0.0.1:9"
"""
REVOKED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    env = {"MMQ_AUTH__REVOCATION_CHECK_S": "0.5", "MMQ_API__KEEPALIVE_S": "1"}
    deployment = Deployment(redis_url, tmp_path_factory.mktemp("streams"), env, config=LLM)
    with serving(deployment):
        deployment.start_api()
        yield deployment


def test_a_completion_stream_ends_with_an_error_once_its_key_is_revoked(
    dep: Deployment, redis_url: str
) -> None:
    api = new_owner(dep.redis_url, dep.base_url, f"stream{time.monotonic_ns()}")
    body = {"model": "llm", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {api.key}"}
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    with httpx.stream(
        "POST", f"{dep.base_url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as stream:
        assert stream.status_code == 200
        job_id = stream.headers["x-job-id"]
        lines = stream.iter_lines()
        first = next(lines)
        assert first.startswith(("data: ", ":")) and "error" not in first, first  # open
        assert revoke_key(r, hash_key(api.key)[:12]) is not None
        started = time.monotonic()
        rest = [line for line in lines if line.startswith("data: ")]  # it ends by itself
        assert time.monotonic() - started < REVOKED_WITHIN_S
    assert rest[-1] == "data: [DONE]", rest
    error = json.loads(rest[-2].removeprefix("data: "))
    assert error["error"]["type"] == "api_key_revoked", error
    assert "revoked" in error["error"]["message"]
    deadline = time.monotonic() + 10
    while r.hget(keys.job(job_id), "status") != "canceled" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert r.hget(keys.job(job_id), "status") == "canceled"  # as a client gone cancels it
