"""Issue 65 at admission, against a real API (uvicorn, auth required, real Redis, the
scheduler and an echo worker): a batch's oversized line goes to the error file unread;
an image edit whose header declares a decompression bomb is refused by its pixel count
(and the worker's decoder refuses it too); a JSON body nested too deep is a 422 that names
the path on every route, never a 500."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import time
import wave
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from PIL import Image

from harness.api_client import Api, new_owner
from harness.batch_files import job_line, jsonl
from jobs.errors import TooLarge
from jobstore.api_keys import create_key
from pipelines.image.output import read_image
from tuning.deployment import Deployment, flush, running

pytestmark = pytest.mark.timeout(180)

MAX_LINE_BYTES = 64 * 1024
MAX_PIXELS = 4_000_000
IMAGE = """
[pipelines.tiny-sd]
kind = "image"
impl = "pipelines.image:ImagePipeline"
model = "no-such-model-the-api-never-loads"

[pipelines.asr]
kind = "asr"
impl = "pipelines.asr:AsrPipeline"
"""
MAX_AUDIO_PARTS = 3
MAX_AUDIO_S = 30


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    env = {
        "MMQ_BATCHES__MAX_LINE_BYTES": str(MAX_LINE_BYTES),
        "MMQ_LIMITS__IMAGE_MAX_PIXELS": str(MAX_PIXELS),
        "MMQ_LIMITS__CHAT_MAX_AUDIO_PARTS": str(MAX_AUDIO_PARTS),
        "MMQ_LIMITS__CHAT_MAX_AUDIO_SECONDS": str(MAX_AUDIO_S),
    }
    tmp = tmp_path_factory.mktemp("admission")
    with running(redis_url, tmp, env, ["echo"], config=IMAGE) as deployment:
        yield deployment


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"adm{time.monotonic_ns()}")


def bomb_png(side: int) -> bytes:
    """A 1-bit grey PNG of side x side black pixels: tens of KB that decode to side**2."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    rows = bytes(side * (1 + (side + 7) // 8))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def _batch_errors(api: Api, lines: list[Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    upload = api.http.post(
        "/v1/files", files={"file": ("in.jsonl", jsonl(lines))}, data={"purpose": "batch"}
    )
    assert upload.status_code == 201, upload.text
    made = api.http.post(
        "/v1/batches",
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/jobs",
            "completion_window": "24h",
        },
    )
    assert made.status_code == 200, made.text
    deadline = time.monotonic() + 60
    while (batch := api.http.get(f"/v1/batches/{made.json()['id']}").json())["status"] not in (
        "completed",
        "failed",
    ):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    errors = api.http.get(f"/v1/files/{batch['error_file_id']}/content")
    return batch, [json.loads(line) for line in errors.text.splitlines()]


def test_a_batch_line_over_the_line_limit_goes_to_the_error_file_unread(api: Api) -> None:
    big = job_line("big", "echo", text="a" * (4 * MAX_LINE_BYTES))
    good = job_line("good", "echo", text="hi")
    batch, errors = _batch_errors(api, [big, good, b"", good | {"custom_id": "good2"}])
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    (error,) = errors
    assert error["error"]["line"] == 1 and error["error"]["code"] == "too_large"
    assert "batches.max_line_bytes" in error["error"]["message"]
    assert error["custom_id"] is None  # the line was never read


def test_a_single_huge_line_never_holds_the_api(api: Api, dep: Deployment) -> None:
    """One line of 8 MB, no newline at all: refused by its size, read in chunks."""
    huge = b'{"custom_id": "x", "body": "' + b"a" * 8_000_000 + b'"}'
    batch, errors = _batch_errors(api, [huge])
    assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 1, batch
    assert f"is {len(huge)} bytes" in errors[0]["error"]["message"]
    assert httpx.get(f"{dep.base_url}/healthz").status_code == 200


def test_an_image_edit_whose_header_declares_too_many_pixels_is_refused(api: Api) -> None:
    bomb = bomb_png(3000)  # 9M pixels in about 10 KB, over the 4M allowed here
    assert len(bomb) < 100_000
    r = api.http.post(
        "/v1/images/edits",
        files={"image": ("bomb.png", bomb, "image/png")},
        data={"prompt": "a boat"},
    )
    assert r.status_code == 413, r.text
    error = r.json()["error"]
    assert error["param"] == "image" and "limits.image_max_pixels" in error["message"]
    assert api.http.get("/v1/jobs").json()["data"] == []


def test_the_workers_decoder_refuses_a_bomb_before_decoding_it() -> None:
    with pytest.raises(TooLarge) as refused:
        read_image(bomb_png(13_000), "input.init_image", 25_000_000)
    assert refused.value.field == "input.init_image"
    assert "169000000 pixels" in refused.value.reason
    small = io.BytesIO()
    Image.new("RGB", (64, 48)).save(small, format="PNG")
    assert read_image(small.getvalue(), "input.init_image", 64 * 48).size == (64, 48)


def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/responses",
            {
                "model": "m",
                "input": "hi",
                "tools": [{"type": "function", "name": "f", "parameters": _deep_schema(130)}],
            },
        ),
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {"type": "function", "function": {"name": "f", "parameters": _deep_schema(130)}}
                ],
            },
        ),
        ("/v1/jobs", {"kind": "echo", "input": {"text": "hi"}, "metadata": _deep_schema(100)}),
    ],
)
def test_a_body_nested_too_deep_is_a_422_naming_the_path(
    api: Api, path: str, body: dict[str, Any]
) -> None:
    r = api.http.post(path, json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "api.max_json_depth" in error["message"], error
    first = next(iter(k for k in ("tools", "metadata") if k in body))
    assert error["param"].startswith(f"{first}."), error
    assert r.json() == api.http.post(path, json=body).json()  # the connection lives on


def _wav(seconds: float, rate: int = 8000) -> str:
    """Silence as an 8-bit mono WAV, base64."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(1)
        file.setframerate(rate)
        file.writeframes(b"\x80" * int(seconds * rate))
    return base64.b64encode(out.getvalue()).decode()


def _spoken(*seconds: float) -> dict[str, Any]:
    parts = [
        {"type": "input_audio", "input_audio": {"data": _wav(s), "format": "wav"}} for s in seconds
    ]
    return {"model": "m", "messages": [{"role": "user", "content": parts}]}


def test_audio_parts_and_their_seconds_are_capped_per_chat_request(api: Api) -> None:
    many = api.http.post("/v1/chat/completions", json=_spoken(*[0.5] * (MAX_AUDIO_PARTS + 2)))
    assert many.status_code == 422, many.text
    assert many.json()["error"]["param"] == f"messages.0.content.{MAX_AUDIO_PARTS}.input_audio"
    assert "limits.chat_max_audio_parts" in many.json()["error"]["message"]
    long = api.http.post("/v1/chat/completions", json=_spoken(MAX_AUDIO_S * 0.6, MAX_AUDIO_S * 0.6))
    assert long.status_code == 413, long.text
    assert long.json()["error"]["param"] == "messages.0.content.1.input_audio"
    assert "limits.chat_max_audio_seconds" in long.json()["error"]["message"]
    assert api.http.get("/v1/jobs").json()["data"] == []  # no ASR job was made


def test_a_chat_requests_asr_jobs_are_canceled_when_its_client_goes_away(
    api: Api, dep: Deployment
) -> None:
    """No ASR worker runs here: the stage jobs wait until the client leaves."""
    body = json.dumps(_spoken(1.0, 1.0)).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {api.key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    with socket.create_connection(("127.0.0.1", dep.api_port)) as client:
        client.sendall(request)
        deadline = time.monotonic() + 30
        while len(jobs := api.http.get("/v1/jobs").json()["data"]) < 2:
            assert time.monotonic() < deadline, jobs
            time.sleep(0.1)
        assert {job["status"] for job in jobs} == {"queued"}
    deadline = time.monotonic() + 30
    while {job["status"] for job in api.http.get("/v1/jobs").json()["data"]} != {"canceled"}:
        assert time.monotonic() < deadline, api.http.get("/v1/jobs").json()["data"]
        time.sleep(0.2)


def test_admin_limits_are_set_only_for_owners_that_a_key_names(dep: Deployment, api: Api) -> None:
    admin = Api(
        dep.base_url, create_key(redis.Redis.from_url(dep.redis_url), "adm-admin", admin=True)
    )
    limits = {"max_queued": 3}
    long = admin.http.put(f"/v1/admin/limits/{'o' * 5000}", json=limits)
    assert long.status_code == 422, long.text
    assert long.json()["error"]["param"] == "owner" and len(long.text) < 1000
    nobody = admin.http.put("/v1/admin/limits/nobody-has-this-key", json=limits)
    assert nobody.status_code == 404, nobody.text
    owner = api.http.get("/v1/whoami").json()["owner"]
    kept = admin.http.put(f"/v1/admin/limits/{owner}", json=limits)
    assert kept.status_code == 200, kept.text
    assert kept.json()["max_queued"] == 3
