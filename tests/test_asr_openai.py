"""`/v1/audio/transcriptions` and `/v1/audio/translations` driven by the official
`openai` client against a real deployment with the packaged tiny.en model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from harness.api_client import Api, new_owner
from harness.audio import (
    ASR_MAX_BYTES,
    LONG,
    SHORT,
    asr_deployment,
    reference,
    segment_problems,
    spoken,
    wer,
)
from mmq.client import Client
from tuning.deployment import Deployment

MAX_WER = 0.15


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with asr_deployment(redis_url, tmp_path_factory.mktemp("asr-openai")) as dep:
        yield dep


@pytest.fixture
def api(dep: Deployment) -> Api:
    return new_owner(dep.redis_url, dep.base_url, f"oa{time.monotonic_ns()}")


@pytest.fixture
def client(dep: Deployment, api: Api) -> openai.OpenAI:
    key = api.key
    return openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=key, max_retries=0, timeout=120)


def _short() -> tuple[str, bytes]:
    return ("short.wav", spoken(SHORT, "wav"))


def test_json_and_text(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(model="whisper-1", file=_short())
    assert wer(reference(SHORT), result.text) <= MAX_WER, result.text
    text = client.audio.transcriptions.create(
        model="gpt-4o-mini-transcribe", file=("s.mp3", spoken(SHORT, "mp3")), response_format="text"
    )
    assert isinstance(text, str) and wer(reference(SHORT), text) <= MAX_WER, text


def test_verbose_json_with_words_and_subtitles(client: openai.OpenAI) -> None:
    verbose = client.audio.transcriptions.create(
        model="whisper-1",
        file=_short(),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        language="en",
        temperature=0.0,
    )
    assert verbose.language == "en" and 5 < verbose.duration < 7
    assert verbose.segments and verbose.words
    segments = [s.model_dump() for s in verbose.segments]
    assert segment_problems(segments, verbose.duration) == []
    assert [w.word.lower() for w in verbose.words[:4]] == ["the", "quick", "brown", "fox"]
    srt = client.audio.transcriptions.create(
        model="whisper-1", file=_short(), response_format="srt"
    )
    assert str(srt).startswith("1\n00:00:00,000 --> 00:00:0") and "quick brown fox" in str(srt)
    vtt = client.audio.transcriptions.create(
        model="whisper-1", file=_short(), response_format="vtt"
    )
    assert str(vtt).startswith("WEBVTT\n\n00:00:00.000 --> ") and "kitchen" in str(vtt)


def test_prompt_and_translation(client: openai.OpenAI) -> None:
    prompted = client.audio.transcriptions.create(
        model="whisper-1", file=_short(), prompt="Quick foxes, red boxes."
    )
    assert wer(reference(SHORT), prompted.text) <= MAX_WER, prompted.text
    translated = client.audio.translations.create(model="whisper-1", file=_short())
    assert wer(reference(SHORT), translated.text) <= MAX_WER, translated.text


def test_stream_deltas_then_done(client: openai.OpenAI) -> None:
    stream = client.audio.transcriptions.create(
        model="whisper-1", file=("long.opus", spoken(LONG, "opus")), stream=True
    )
    deltas: list[tuple[float, str]] = []
    sent = time.monotonic()
    done = None
    for event in stream:
        if event.type == "transcript.text.delta":
            deltas.append((time.monotonic() - sent, event.delta))
        else:
            assert event.type == "transcript.text.done"
            done = (time.monotonic() - sent, event.text)
    assert done is not None and len(deltas) >= 8
    assert "".join(d for _, d in deltas) == done[1]
    assert wer(reference(LONG), done[1]) <= MAX_WER, done[1]
    assert deltas[0][0] < 0.5 * done[0], (deltas[0][0], done[0])


def test_client_errors_name_the_param(client: openai.OpenAI) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "whisper-1", "response_format": "xml"}, "response_format"),
        ({"model": "whisper-9"}, "model"),
        ({"model": "whisper-1", "language": "English"}, "language"),
        ({"model": "whisper-1", "temperature": 3.0}, "temperature"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            client.audio.transcriptions.create(file=_short(), **kwargs)
        assert caught.value.body["param"] == param, (kwargs, caught.value.body)  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.audio.transcriptions.create(model="whisper-1", file=("x.mp3", b"not audio" * 99))
    assert caught.value.body["param"] == "file"  # type: ignore[index]
    assert "could not be decoded" in caught.value.message
    assert "/" not in caught.value.message  # no server paths
    huge = ("x.wav", b"0" * (ASR_MAX_BYTES + 1))
    with pytest.raises(openai.APIStatusError) as too_big:
        client.audio.transcriptions.create(model="whisper-1", file=huge)
    assert too_big.value.status_code == 413
    assert too_big.value.body["type"] == "too_large"  # type: ignore[index]


def test_auth_is_required(dep: Deployment) -> None:
    anonymous = openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anonymous.audio.transcriptions.create(model="whisper-1", file=_short())


def test_leaving_a_stream_cancels_its_job(dep: Deployment, api: Api) -> None:
    files = {"file": ("long.mp3", spoken(LONG, "mp3"))}
    data = {"model": "whisper-1", "stream": "true"}
    with api.http.stream("POST", "/v1/audio/transcriptions", files=files, data=data) as response:
        assert response.status_code == 200
        job_id = response.headers["x-job-id"]
        next(line for line in response.iter_lines() if "transcript.text.delta" in line)
    key = api.key
    ended = Client(dep.base_url, key).wait(job_id, timeout_s=30)
    assert ended["status"] == "canceled", ended
    assert ended["input"]["audio"].endswith("/long.mp3")


def test_the_job_is_a_job_like_any_other(dep: Deployment, api: Api) -> None:
    r = api.http.post(
        "/v1/audio/transcriptions",
        files={"file": ("short.wav", spoken(SHORT, "wav"))},
        data={"model": "whisper-1", "response_format": "verbose_json"},
    )
    assert r.status_code == 200, r.text
    job = api.get(r.headers["x-job-id"])
    assert job["kind"] == "asr" and job["status"] == "succeeded" and job["model"] == "asr"
    assert job["output"]["text"] == r.json()["text"]
    stored = api.http.get(f"/v1/files/{job['input']['audio']}")
    assert stored.status_code == 200 and stored.content == spoken(SHORT, "wav")
