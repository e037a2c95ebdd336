"""What an outside probe of a deployment with auth required tried (issue 50), against real
processes at log level DEBUG, on a Redis with a password: an input URL that drips bytes is
stopped at its deadline, and at once by a cancel; the websocket refuses a bad `?after=`
as SSE does; one key's event streams are capped; a body that never ends gets 408;
`/metrics` without a key; no secret that the deployment used (API keys in headers and in
`?token=`, signed URLs, the webhook secret, the Redis password, the signing secret) is in
any of its logs; and the OpenAPI document fuzzed (schemathesis, with lone surrogates and
huge integers put into its bodies) finds no 5xx."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import redis
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from common.procs import free_port
from harness.api_client import Api, new_owner
from harness.storage_servers import add_file_pipeline, http_server
from host.redis_server import RedisServer
from jobstore.api_keys import create_key
from tests.conftest import WEBHOOK_SECRET
from tuning.deployment import Deployment, serving, wait_until

REDIS_PASSWORD = "probe-redis-password-7f3a9c"
SIGNING_SECRET = "probe-signing-secret-0123456789abcdef-0123"
MAX_STREAMS = 3
FETCH_DEADLINE_S = 2.0
BODY_TIMEOUT_S = 2.0

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(
        tmp_path_factory.mktemp("redis-pw"),
        persist=False,
        extra_args=["--requirepass", REDIS_PASSWORD],
    )
    server.start()
    try:
        yield f"redis://:{REDIS_PASSWORD}@127.0.0.1:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hooks() -> Iterator[tuple[str, list[bytes]]]:
    """A webhook receiver: its URL and the bodies it got."""
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", got
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def dep(redis_with_password: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    env = {
        "MMQ_LOG_LEVEL": "DEBUG",
        "MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET,
        "MMQ_WEBHOOKS__BACKOFF_S": "0.2",
        "MMQ_STORAGE__SIGNING_SECRET": SIGNING_SECRET,
        "MMQ_NET__ALLOWED_NETWORKS": '["127.0.0.1/32"]',
        "MMQ_NET__FETCH_DEADLINE_S": str(FETCH_DEADLINE_S),
        "MMQ_API__MAX_STREAMS_PER_KEY": str(MAX_STREAMS),
        "MMQ_API__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "MMQ_API__MAX_WAIT_S": "1",
        "MMQ_API__METRICS_WITHOUT_KEY": "none",
    }
    deployment = Deployment(redis_with_password, tmp_path_factory.mktemp("probe"), env)
    add_file_pipeline(deployment)
    with serving(deployment):
        webhooks = deployment.spawn("webhooks", "webhooks")
        deployment.start(["filesum", "echo"], reaper=False)
        deployment.wait_started([webhooks])
        yield deployment


@pytest.fixture(scope="module")
def r(redis_with_password: str) -> redis.Redis:
    return redis.Redis.from_url(redis_with_password, decode_responses=True)


@pytest.fixture(scope="module")
def owner(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, "prober")


@pytest.fixture(scope="module")
def admin(dep: Deployment, r: redis.Redis) -> Api:
    return Api(dep.base_url, create_key(r, "probe-admin", admin=True))


def _ws_url(dep: Deployment, job_id: str, query: str) -> str:
    return f"ws://127.0.0.1:{dep.api_port}/v1/jobs/{job_id}/ws?{query}"


def test_an_input_url_that_drips_is_stopped_at_its_deadline_or_at_once_by_a_cancel(
    owner: Api,
) -> None:
    with http_server() as base:
        job = owner.submit("filesum", file=f"{base}/drip/1000?every=0.2")
        started = time.monotonic()
        done = owner.wait(job["id"], timeout_s=30)
        assert done["status"] == "failed", done
        assert done["error"]["field"] == "file"  # as the pipeline names it
        assert f"within {FETCH_DEADLINE_S:g} s (net.fetch_deadline_s)" in done["error"]["message"]
        assert time.monotonic() - started < 15  # the drip alone would take 200 s

        # A cancel while the worker waits on a server that sends nothing.
        job = owner.submit("filesum", file=f"{base}/silent")
        wait_until(lambda: owner.get(job["id"])["status"] == "running", timeout_s=15)
        canceled_at = time.monotonic()
        assert owner.http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
        done = owner.wait(job["id"], timeout_s=10)
        assert done["status"] == "canceled", done
        assert time.monotonic() - canceled_at < FETCH_DEADLINE_S + 1.5


def test_the_websocket_refuses_a_bad_after_as_sse_does(dep: Deployment, owner: Api) -> None:
    job = owner.submit("echo", text="hi")
    owner.wait(job["id"])
    for after in ("abc", "99999999999999999999-0", "1-2-3"):
        sse = owner.http.get(f"/v1/jobs/{job['id']}/events", params={"after": after})
        assert sse.status_code == 422 and sse.json()["error"]["param"] == "after"
        with (
            connect(_ws_url(dep, job["id"], f"token={owner.key}&after={after}")) as ws,
            pytest.raises(ConnectionClosedError) as closed,
        ):
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1008
        assert closed.value.rcvd.reason.startswith("after: must be an event id")
    with connect(_ws_url(dep, job["id"], f"token={owner.key}&after=0-0")) as ws:
        assert json.loads(ws.recv(timeout=10))["type"] == "status"


def test_one_keys_event_streams_are_capped(dep: Deployment, r: redis.Redis) -> None:
    """A job that stays queued (no worker for `sleep`) is followed MAX_STREAMS times; the
    next follow of that key gets 429 over SSE and the websocket, another key's (an admin
    following the same job) does not, and a closed stream gives its place back."""
    greedy = new_owner(dep.redis_url, dep.base_url, "greedy")
    admin = Api(dep.base_url, create_key(r, "other", admin=True))
    job = greedy.submit("sleep", steps=1, step_ms=1)
    url = f"{dep.base_url}/v1/jobs/{job['id']}/events"

    def status(api: Api) -> int:
        """The status a new follow gets (its stream closed at once)."""
        with httpx.stream("GET", url, headers=api.http.headers, timeout=10) as response:
            if response.status_code != 200:
                response.read()
            return response.status_code

    with contextlib.ExitStack() as held:
        streams = [
            held.enter_context(httpx.stream("GET", url, headers=greedy.http.headers, timeout=10))
            for _ in range(MAX_STREAMS)
        ]
        assert [s.status_code for s in streams] == [200] * MAX_STREAMS
        over = httpx.get(url, headers=greedy.http.headers, timeout=10)
        assert over.status_code == 429 and int(over.headers["Retry-After"]) > 0
        assert over.json()["error"]["type"] == "too_many_streams"
        with pytest.raises(InvalidStatus) as denied:
            connect(_ws_url(dep, job["id"], f"token={greedy.key}"))
        assert denied.value.response.status_code == 429
        assert status(admin) == 200
        streams[0].close()
        wait_until(lambda: status(greedy) == 200, timeout_s=10)
    greedy.http.post(f"/v1/jobs/{job['id']}/cancel")


def test_a_body_that_never_ends_gets_408(dep: Deployment, owner: Api) -> None:
    with socket.create_connection(("127.0.0.1", dep.api_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {owner.key}\r\nContent-Length: 100\r\n\r\n".encode()
        )
        started = time.monotonic()
        head = b""
        for _ in range(40):  # a byte every 0.25 s, until the API answers
            try:
                sock.sendall(b" ")
            except OSError:
                break
            sock.settimeout(0.25)
            try:
                head += sock.recv(4096)
            except TimeoutError:
                continue
            if head:
                break
    assert head.startswith(b"HTTP/1.1 408"), head
    assert time.monotonic() - started < BODY_TIMEOUT_S + 3


def test_metrics_without_a_key_is_a_setting(dep: Deployment, admin: Api, owner: Api) -> None:
    """`api.metrics_without_key = "none"` here: 401 without a key; a key that is not an
    admin's sees no series that names an owner; an admin's sees them."""
    owner.wait(owner.submit("echo", text="counted")["id"])  # the owner has a usage to show
    assert httpx.get(f"{dep.base_url}/metrics").status_code == 401
    plain = owner.http.get("/metrics")
    assert plain.status_code == 200 and "mmq_jobs_queued" in plain.text
    assert not [line for line in plain.text.splitlines() if line.startswith("mmq_key_")]
    assert 'owner="' not in plain.text
    assert 'mmq_key_requests{owner="prober"}' in admin.http.get("/metrics").text


def test_no_secret_is_in_any_log(
    dep: Deployment, owner: Api, admin: Api, hooks: tuple[str, list[bytes]]
) -> None:
    """Each secret is used first (a websocket with `?token=`, accepted and refused, a
    signed URL fetched and one tampered with, a delivered webhook), then no log of the
    deployment (API, workers, webhook sender, at DEBUG) holds any of them."""
    url, delivered = hooks
    job = owner.http.post(
        "/v1/jobs", json={"kind": "echo", "input": {"text": "hi"}, "webhook": {"url": url}}
    ).json()
    done = owner.wait(job["id"])
    wait_until(lambda: len(delivered) > 0, timeout_s=20)
    with connect(_ws_url(dep, job["id"], f"token={owner.key}")) as ws:
        ws.recv(timeout=10)
    for key in (owner.key, admin.key):  # refused handshakes are logged too
        with pytest.raises(InvalidStatus):
            connect(_ws_url(dep, "job_nothing", f"token={key}"))
    upload = owner.http.post("/v1/files", files={"file": ("a.txt", b"hello", "text/plain")})
    signed = upload.json()["url"]
    signature = parse_qs(urlsplit(signed).query)["signature"][0]
    assert httpx.get(signed).status_code == 200
    assert httpx.get(signed.replace("expires=", "expires=1")).status_code in (401, 403)
    assert done["status"] == "succeeded"

    secrets = {
        "the owner's key": str(owner.key),
        "the admin's key": str(admin.key),
        "the Redis password": REDIS_PASSWORD,
        "the webhook secret": WEBHOOK_SECRET,
        "the webhook secret's key": WEBHOOK_SECRET.removeprefix("whsec_"),
        "the signing secret": SIGNING_SECRET,
        "a signed URL's signature": signature,
    }
    logs = {proc.name: proc.log() for proc in dep.procs}
    assert "WebSocket /v1/jobs/" in logs["api"]  # uvicorn's handshake lines are there
    assert "DEBUG" in logs["api"] and "DEBUG" in logs["webhooks"]
    found = [
        f"{what} in {name}'s log"
        for what, secret in secrets.items()
        for name, text in logs.items()
        if secret in text
    ]
    assert found == []


EXAMPLES = int(os.environ.get("MMQ_FUZZ_EXAMPLES", "6"))
"""Cases per operation and generation mode: 6 is the suite's quick pass;
`MMQ_FUZZ_EXAMPLES=200 pytest tests/test_probe.py -k fuzzed` is a long one."""
ENDLESS = {"GET /v1/admin/overview/stream"}
"""Operations whose answer never ends (a live SSE feed): tests/test_admin reads it."""
SURROGATE = "\udfff"
HUGE = 10**30


def _poisoned(body: Any, how: str, at: int) -> Any:
    """`body` with its `at`-th string (or key) given a lone surrogate, or its `at`-th
    number made 10**30, by `how` (counting wraps around; no such leaf: unchanged)."""
    leaves: list[tuple[Any, Any, bool]] = []  # (container, key or index, is a key)

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in list(items):
            if how == "text" and isinstance(node, dict):
                leaves.append((node, k, True))
            wanted = str if how == "text" else (int, float)
            if isinstance(v, wanted) and not isinstance(v, bool):
                leaves.append((node, k, False))
            elif isinstance(v, dict | list):
                walk(v)

    walk(body)
    if not leaves:
        return body
    node, k, is_key = leaves[at % len(leaves)]
    if is_key:
        node[k + SURROGATE] = node.pop(k)
    else:
        node[k] = node[k] + SURROGATE if how == "text" else HUGE
    return body


def test_the_openapi_document_fuzzed_finds_no_5xx(dep: Deployment, admin: Api) -> None:
    """Every operation of the published document, with valid and invalid cases
    (schemathesis), their JSON bodies also given a lone surrogate or a 10**30 somewhere,
    sent with an admin's key: no answer is a 5xx (`/readyz`'s 503 says a worker is missing,
    as it should here)."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import errors as hypothesis_errors
    from hypothesis import strategies as st
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(f"{dep.base_url}/openapi.json")
    session = requests.Session()
    auth = {"Authorization": f"Bearer {admin.key}"}
    server_errors: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.label in ENDLESS:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(
                case=operation.as_strategy(generation_mode=mode, headers=auth),
                how=st.sampled_from(["none", "text", "number"]),
                at=st.integers(0, 40),
            )
            def check(case: Any, how: str, at: int) -> None:
                nonlocal calls
                poison = how != "none" and case.media_type == "application/json"
                if poison and isinstance(case.body, dict | list):
                    # Sent as the client wrote it: schemathesis would check it first.
                    response = session.request(
                        case.method,
                        dep.base_url + case.formatted_path,
                        params=case.query,
                        headers={**(case.headers or {}), "Content-Type": "application/json"},
                        data=json.dumps(_poisoned(case.body, how, at)).encode(),
                        timeout=15,
                    )
                else:
                    response = case.call(base_url=dep.base_url, session=session, timeout=15)
                calls += 1
                meant = case.operation.label == "GET /readyz" and response.status_code == 503
                if response.status_code >= 500 and not meant:
                    server_errors.append(
                        f"{case.operation.label} {how}: {response.status_code} "
                        f"{response.text[:300]}"
                    )

            try:
                check()
            except (hypothesis_errors.Unsatisfiable, hypothesis_errors.FailedHealthCheck):
                continue  # no case of this mode for this operation
    assert calls > 100
    assert server_errors == []
    dep.check_alive()
