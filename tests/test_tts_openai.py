"""`POST /v1/audio/speech` driven by the official `openai` client against a real deployment."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Literal

import httpx
import numpy as np
import openai
import pytest

from harness.api_client import Api, new_owner
from harness.tts import decode, start_workers, tts_deployment
from tuning.deployment import Deployment, flush, serving, wait_until

TEXT = (
    "The first sentence leaves early. The second one follows it. A third one is here. "
    "The fourth comes next. And the fifth ends the story."
)


@pytest.fixture(scope="module")
def tts(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    dep = tts_deployment(redis_url, tmp_path_factory.mktemp("tts-openai"), xtts=False)
    with serving(dep):
        dep.start_api()
        start_workers(dep, "tts", 1)
        yield dep


@pytest.fixture
def api(tts: Deployment) -> Api:
    return new_owner(tts.redis_url, tts.base_url, f"oai{time.monotonic_ns()}")


@pytest.fixture
def client(tts: Deployment, api: Api) -> openai.OpenAI:
    key = api.key
    return openai.OpenAI(base_url=f"{tts.base_url}/v1", api_key=key, max_retries=0)


def test_create_returns_the_whole_file(client: openai.OpenAI) -> None:
    speech = client.audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="wav"
    )
    samples, rate = decode(speech.content)
    assert rate == 22050 and samples.size / rate > 5
    assert speech.response.headers["content-type"] == "audio/wav"


def test_pcm_streams_before_synthesis_ends(client: openai.OpenAI, api: Api) -> None:
    arrivals: list[tuple[float, int]] = []
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm"
    ) as response:
        job_id = response.headers["x-job-id"]
        assert response.headers["x-sample-rate"] == "24000"
        for chunk in response.iter_bytes():
            arrivals.append((time.time(), len(chunk)))
    job = api.wait(job_id)
    assert job["status"] == "succeeded" and job["output"]["sample_rate"] == 24000
    finished = datetime.fromisoformat(job["finished_at"]).timestamp()
    assert arrivals[0][0] < finished  # the first bytes left before the job ended
    total = sum(size for _, size in arrivals)
    assert total / 2 / 24000 == pytest.approx(job["output"]["duration_s"], rel=0.01)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav"])
def test_encoded_streams_play(
    client: openai.OpenAI, fmt: Literal["mp3", "opus", "flac", "wav"]
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="joe", input="A short one. Then another.", response_format=fmt
    ) as response:
        data = b"".join(response.iter_bytes())
    samples, _ = decode(data, {"opus": "ogg"}.get(fmt, fmt))
    assert samples.size > 0 and np.abs(samples).max() > 0.05


def test_sse_sends_deltas_then_done(client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [json.loads(line[6:]) for line in response.iter_lines() if line]
    types = [p["type"] for p in payloads]
    assert types[-1] == "speech.audio.done" and set(types[:-1]) == {"speech.audio.delta"}
    assert len(types) > 5  # one delta per sentence at least
    pcm = b"".join(base64.b64decode(p["audio"]) for p in payloads[:-1])
    assert len(pcm) / 2 / 24000 > 5


def test_a_coqui_voice_and_extensions(client: openai.OpenAI) -> None:
    speech = client.audio.speech.create(
        model="tts-1",
        voice="tiny",
        input="Hello. Goodbye.",
        response_format="flac",
        extra_body={"sample_rate": 22050},
    )
    samples, rate = decode(speech.content)
    assert rate == 22050 and samples.size > 0


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"model": "whisper-1"}, "model"),
        ({"input": ""}, "input"),
        ({"input": "x" * 3001}, "input"),
        ({"input": "?!"}, "input"),
        ({"response_format": "aac"}, "response_format"),
        ({"speed": 5.0}, "speed"),
    ],
)
def test_bad_requests_get_422_naming_the_param(
    client: openai.OpenAI, kwargs: dict[str, object], param: str
) -> None:
    request = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **kwargs}
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.audio.speech.create(**request)  # type: ignore[arg-type]
    assert caught.value.status_code == 422
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param, body


def test_a_key_is_required(tts: Deployment) -> None:
    anonymous = openai.OpenAI(base_url=f"{tts.base_url}/v1", api_key="not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.audio.speech.create(model="tts-1", voice="alloy", input="Hello.")


def test_a_client_that_leaves_cancels_its_job(tts: Deployment, api: Api) -> None:
    long_text = " ".join(f"Sentence {n} of a text nobody will hear." for n in range(40))
    body = {"model": "tts-1", "voice": "alloy", "input": long_text, "response_format": "pcm"}
    with api.http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        job_id = response.headers["x-job-id"]
        next(response.iter_bytes())
    wait_until(lambda: api.get(job_id)["status"] == "canceled", timeout_s=20)
    assert api.get(job_id)["output"] is None


def test_unknown_fields_are_refused(tts: Deployment, api: Api) -> None:
    r = httpx.post(
        f"{tts.base_url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": "Hi.", "extra": 1},
        headers={"Authorization": api.http.headers["authorization"]},
    )
    assert r.status_code == 422 and r.json()["error"]["param"] == "extra"


def test_voices_lists_each_voice_with_its_aliases_and_the_default(
    tts: Deployment, api: Api, client: openai.OpenAI
) -> None:
    listed = api.http.get("/v1/audio/voices")
    assert listed.status_code == 200, listed.text
    voices = {v["id"]: v for v in listed.json()["data"]}
    assert set(voices) == {"joe", "tiny"}
    assert voices["joe"] == {
        "id": "joe", "object": "voice", "pipeline": "tts", "engine": "piper",
        "aliases": ["alloy"], "default": True,
    }  # fmt: skip
    assert voices["tiny"]["engine"] == "coqui" and not voices["tiny"]["default"]
    for voice in voices.values():  # each one listed speaks
        speech = client.audio.speech.create(
            model=voice["pipeline"],
            voice=voice["id"],
            input="Hi.",
            response_format="wav",  # type: ignore[arg-type]
        )
        assert decode(speech.content)[0].size > 0
    assert httpx.get(f"{tts.base_url}/v1/audio/voices", timeout=10).status_code == 401
