"""Issue 65 against a real API (uvicorn, auth required, real Redis): a revoked key stops
its client secrets at once and its open connections (a realtime session, a job's SSE and
websocket streams, a streamed chat completion) within seconds, each with an error that
says why; one tenant cannot fill Redis through realtime event logs or client secrets, and
`/metrics` counts what the logs hold. No worker runs: a queued job's stream stays open,
and a transcription session opens without one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from harness.api_client import Api, new_owner
from harness.realtime import Session, open_session
from harness.scrape import scrape, value
from jobs import keys
from jobstore.api_keys import create_key, hash_key, revoke_key
from tuning.deployment import Deployment, flush, serving

pytestmark = pytest.mark.timeout(120)

ASR = """
[pipelines.asr]
kind = "asr"
impl = "pipelines.asr:AsrPipeline"
[pipelines.llm]
kind = "llm"
impl = "pipelines.llm:LlmPipeline"
model = "remote"
[pipelines.llm.options]
engine = "url"
engine_url = "http://127.0.0.1:9"
"""
MAX_SECRETS = 3
SESSION_LOG_BYTES = 64 * 1024
REVOKED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    env = {
        "MMQ_AUTH__REVOCATION_CHECK_S": "0.5",
        "MMQ_API__KEEPALIVE_S": "1",
        "MMQ_REALTIME__MAX_SECRETS_PER_KEY": str(MAX_SECRETS),
        "MMQ_REALTIME__MAX_SESSION_LOG_BYTES": str(SESSION_LOG_BYTES),
        "MMQ_REALTIME__MAX_EVENT_BYTES": "4096",
    }
    deployment = Deployment(redis_url, tmp_path_factory.mktemp("sec"), env, config=ASR)
    with serving(deployment):
        deployment.start_api()
        yield deployment


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url, decode_responses=True)


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"sec{time.monotonic_ns()}")


def _secret(dep: Deployment, api: Api, **session: object) -> httpx.Response:
    return httpx.post(
        f"{dep.base_url}/v1/realtime/client_secrets",
        headers={"Authorization": f"Bearer {api.key}"},
        json={"session": {"type": "transcription", **session}},
    )


def _revoke(r: redis.Redis, api: Api) -> None:
    assert revoke_key(r, hash_key(api.key)[:12]) is not None


def _ends_revoked(session: Session) -> None:
    error = session.until("error", timeout_s=REVOKED_WITHIN_S)
    assert error["error"]["code"] == "api_key_revoked", error
    assert "revoked" in error["error"]["message"]
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            session.socket.recv(timeout=REVOKED_WITHIN_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_a_secret_made_before_its_key_was_revoked_opens_nothing(
    dep: Deployment, api: Api, r: redis.Redis
) -> None:
    made = _secret(dep, api)
    assert made.status_code == 200, made.text
    secret = made.json()["value"]
    open_session(dep.base_url, secret, secret=True).close()  # it works while the key lives
    _revoke(r, api)
    with pytest.raises(InvalidStatus) as refused:
        open_session(dep.base_url, secret, secret=True)
    assert refused.value.response.status_code == 401


@pytest.mark.parametrize("by_secret", [False, True])
def test_an_open_session_ends_with_an_error_once_its_key_is_revoked(
    dep: Deployment, r: redis.Redis, by_secret: bool
) -> None:
    api = new_owner(dep.redis_url, dep.base_url, f"sec{time.monotonic_ns()}")
    token = _secret(dep, api).json()["value"] if by_secret else api.key
    session = open_session(dep.base_url, token, "intent=transcription", secret=by_secret)
    session.until("session.created")
    _revoke(r, api)
    _ends_revoked(session)


def test_a_jobs_event_streams_end_once_their_key_is_revoked(
    dep: Deployment, r: redis.Redis
) -> None:
    api = new_owner(dep.redis_url, dep.base_url, f"sec{time.monotonic_ns()}")
    job = api.submit("sleep", steps=1, step_ms=10)  # no worker: it stays queued
    url = f"ws://127.0.0.1:{dep.api_port}/v1/jobs/{job['id']}/ws?token={api.key}"
    headers = {"Authorization": f"Bearer {api.key}"}
    with (
        connect(url) as socket,
        httpx.stream(
            "GET", f"{dep.base_url}/v1/jobs/{job['id']}/events", headers=headers, timeout=30
        ) as sse,
    ):
        assert sse.status_code == 200
        lines = sse.iter_lines()
        assert next(lines).startswith("id: ")  # the replay began
        socket.recv(timeout=10)
        _revoke(r, api)
        started = time.monotonic()
        rest = list(lines)  # the stream ends by itself
        assert time.monotonic() - started < REVOKED_WITHIN_S
        assert "event: error" in rest, rest
        assert "api_key_revoked" in rest[rest.index("event: error") + 1]
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                last = socket.recv(timeout=REVOKED_WITHIN_S)
                assert isinstance(last, str)
                gone = json.loads(last)
        assert gone["error"]["type"] == "api_key_revoked", gone
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_client_input_is_echoed_as_a_short_prefix_and_logs_are_bounded(
    dep: Deployment, api: Api
) -> None:
    session = open_session(dep.base_url, api.key, "intent=transcription")
    session_id = session.until("session.created")["session"]["id"]
    before = value(scrape(dep), "mmq_realtime_log_bytes")
    big = "x" * 200_000
    for _ in range(5):
        session.send({"type": big})
        error = session.until("error")
        assert len(error["error"]["message"]) < 300, len(error["error"]["message"])
        assert "200000 characters" in error["error"]["message"]
    session.close()
    stored = httpx.get(
        f"{dep.base_url}/v1/realtime/sessions/{session_id}/events",
        headers={"Authorization": f"Bearer {api.key}"},
    )
    assert stored.status_code == 200
    assert len(stored.content) < SESSION_LOG_BYTES
    grown = value(scrape(dep), "mmq_realtime_log_bytes") - before
    assert 0 < grown < SESSION_LOG_BYTES


def test_a_stored_event_and_a_sessions_log_are_capped_in_bytes(dep: Deployment, api: Api) -> None:
    session = open_session(dep.base_url, api.key, "intent=transcription")
    session_id = session.until("session.created")["session"]["id"]

    def item(n: int, chars: int) -> dict[str, object]:
        content = [{"type": "input_text", "text": "a" * chars}]
        return {"id": f"item{n}", "type": "message", "role": "user", "content": content}

    # Over `max_event_bytes` (4 KiB here): sent whole, stored as a record of its size.
    session.send({"type": "conversation.item.create", "item": item(0, 10_000)})
    added = session.until("conversation.item.added")
    assert len(added["item"]["content"][0]["text"]) == 10_000
    # About 3.3 KB an event, two events an item: 20 items pass the session's 64 KiB.
    for n in range(1, 21):
        session.send({"type": "conversation.item.create", "item": item(n, 3_000)})
    session.send({"type": "conversation.item.retrieve", "item_id": "none"})
    session.until("error")
    session.close()
    stored = httpx.get(
        f"{dep.base_url}/v1/realtime/sessions/{session_id}/events",
        headers={"Authorization": f"Bearer {api.key}"},
    ).text
    data = [json.loads(line[6:]) for line in stored.splitlines() if line.startswith("data: ")]
    types = [event["type"] for event in data]
    assert types[1:3] == ["mmq.event_truncated"] * 2, types
    assert data[1]["event_type"] == "conversation.item.added" and data[1]["bytes"] > 10_000
    assert types.count("mmq.log_truncated") == 1, types
    assert sum(len(json.dumps(event)) for event in data) <= SESSION_LOG_BYTES


def test_client_secrets_are_capped_per_key_and_in_size(dep: Deployment, api: Api) -> None:
    for _ in range(MAX_SECRETS):
        assert _secret(dep, api).status_code == 200
    over = _secret(dep, api)
    assert over.status_code == 429, over.text
    assert 500 <= int(over.headers["retry-after"]) <= 600
    assert "realtime.max_secrets_per_key" in over.json()["error"]["message"]
    other = new_owner(dep.redis_url, dep.base_url, f"sec{time.monotonic_ns()}")
    big = _secret(dep, other, audio={"input": {"transcription": {"prompt": "p"}}})
    assert big.status_code == 200, big.text
    huge = httpx.post(
        f"{dep.base_url}/v1/realtime/client_secrets",
        headers={"Authorization": f"Bearer {other.key}"},
        json={"session": {"type": "realtime", "instructions": "i" * 90_000}},
    )
    assert huge.status_code == 413, huge.text
    assert huge.json()["error"]["param"] == "session"


def test_refused_handshakes_and_long_cursors_write_no_error_lines(
    dep: Deployment, api: Api
) -> None:
    """Anyone without a key must not be able to write ERROR lines into the API's log, and
    a client's long value is not logged whole."""
    base = f"ws://127.0.0.1:{dep.api_port}"
    for url in (f"{base}/v1/realtime", f"{base}/v1/jobs/j_x/ws", f"{base}/v1/jobs/j_x/ws?token=x"):
        with pytest.raises(InvalidStatus):
            connect(url).close()
    long_after = "1" * 5000
    r = api.http.get(f"/v1/jobs/j_x/events?after={long_after}")
    assert r.status_code == 422
    cursor = f"{base}/v1/jobs/j_x/ws?token={api.key}&after={long_after}"
    with pytest.raises(ConnectionClosed), connect(cursor) as socket:
        socket.recv(timeout=10)
    time.sleep(0.5)  # the log is written by another process
    log = "\n".join(proc.log() for proc in dep.procs)  # whole: `logs()` keeps tails
    assert "without completing handshake" not in log
    assert "ERROR" not in log, [line for line in log.splitlines() if "ERROR" in line][:5]
    assert long_after not in log


def test_an_admins_overview_stream_ends_once_its_key_is_revoked(
    dep: Deployment, r: redis.Redis
) -> None:
    admin = Api(dep.base_url, create_key(r, f"secadm{time.monotonic_ns()}", admin=True))
    headers = {"Authorization": f"Bearer {admin.key}"}
    url = f"{dep.base_url}/v1/admin/overview/stream?interval_s=0.5"
    with httpx.stream("GET", url, headers=headers, timeout=30) as sse:
        assert sse.status_code == 200
        lines = sse.iter_lines()
        assert "event: overview" in [next(lines) for _ in range(4)]
        _revoke(r, admin)
        rest = list(lines)  # the stream ends by itself
    assert "event: error" in rest and "api_key_revoked" in rest[rest.index("event: error") + 1]


def test_a_completion_stream_ends_with_an_error_once_its_key_is_revoked(
    dep: Deployment, r: redis.Redis, api: Api
) -> None:
    """A streamed chat completion whose key is revoked meanwhile ends with an error chunk
    that says why, and its job is canceled. No LLM worker runs: the job stays queued, so the
    stream stays open on keep-alives until the revocation ends it."""
    body = {"model": "llm", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {api.key}"}
    with httpx.stream(
        "POST", f"{dep.base_url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as stream:
        assert stream.status_code == 200
        job_id = stream.headers["x-job-id"]
        lines = stream.iter_lines()
        first = next(lines)
        assert first.startswith(("data: ", ":")) and "error" not in first, first  # open
        _revoke(r, api)
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
