"""`/v1/realtime`: OpenAI's Realtime API over a websocket, on the session deployment with a
real worker of each kind (tiny.en ASR, a tiny random-weight LLM on `transformers serve`, the
Piper voice). Every server event is checked against the official client's model of its type
(`harness.realtime.checked`)."""

from __future__ import annotations

import base64
import json
import signal
import time
from typing import Any

import httpx
import openai
import pytest
import redis
from websockets.exceptions import InvalidStatus

from harness.api_client import Api, new_owner
from harness.realtime import Session, open_session, pcm24, silence
from harness.scrape import scrape, value
from harness.tts import decode
from realtime.session import wav
from tuning.deployment import Deployment, running_on, wait_until

SAID = ("The quick brown fox jumps over the lazy dog.",)


@pytest.fixture
def api(kinds_dep: Deployment) -> Api:
    return new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"rt{time.monotonic_ns()}")


def _open(dep: Deployment, api: Api, query: str = "model=llm") -> Session:
    session = open_session(dep.base_url, api.key, query)
    created = session.next()
    assert created["type"] == "session.created", created
    return session


def _configure(session: Session, **fields: Any) -> dict[str, Any]:
    session.send({"type": "session.update", "session": {"type": "realtime", **fields}})
    return session.until(lambda e: e["type"] in ("session.updated", "error"))


def _jobs(api: Api, kind: str) -> list[dict[str, Any]]:
    page = api.http.get("/v1/jobs", params={"kind": kind, "limit": 100}).json()
    jobs: list[dict[str, Any]] = page["data"]
    return sorted(jobs, key=lambda j: j["created_at"])


def test_a_spoken_turn_is_heard_transcribed_answered_and_spoken(
    kinds_dep: Deployment, api: Api
) -> None:
    # OpenAI's model names mean this deployment's default LLM and ASR model.
    session = _open(kinds_dep, api, "model=gpt-realtime")
    updated = _configure(
        session,
        instructions="Answer briefly.",
        max_output_tokens=120,
        audio={"input": {"transcription": {"model": "whisper-1"}}, "output": {"voice": "joe"}},
    )
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    session.stream(pcm24(SAID))
    done = session.until("response.done")
    types = session.types()
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_item.added",
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.output_item.done",
        "response.done",
    ]
    positions = [types.index(kind) for kind in order]
    assert positions == sorted(positions), types
    transcript = session.of("conversation.item.input_audio_transcription.completed")[0]
    assert "fox" in transcript["transcript"].lower(), transcript
    assert session.of("conversation.item.input_audio_transcription.delta")
    started = session.of("input_audio_buffer.speech_started")[0]
    stopped = session.of("input_audio_buffer.speech_stopped")[0]
    # Where VAD placed the turn on the audio's own clock (the speech starts at once and
    # lasts about 2.5 s): positions in the stream, not timings.
    assert 0 <= started["audio_start_ms"] < 600 < stopped["audio_end_ms"], (started, stopped)
    assert done["response"]["status"] == "completed", done
    assert done["response"]["usage"]["output_tokens"] > 0
    said = session.of("response.output_audio_transcript.done")[0]["transcript"]
    assert said == "".join(e["delta"] for e in session.of("response.output_audio_transcript.delta"))
    assert len(session.audio()) > 24_000  # more than half a second of speech
    session.close()
    # Each stage ran as a job of its kind; the voice began while the LLM still wrote.
    (asr,) = _jobs(api, "asr")
    (llm,) = _jobs(api, "llm")
    tts = _jobs(api, "tts")
    assert asr["status"] == llm["status"] == "succeeded" and tts, (asr, llm)
    assert all(job["status"] == "succeeded" and job["priority"] == "high" for job in tts)
    assert tts[0]["started_at"] < llm["finished_at"], (tts[0], llm)
    asked = llm["input"]["messages"][-1]
    assert (asked["role"], asked["content"]) == ("user", transcript["transcript"]), asked


def test_text_turns_answer_in_text(kinds_dep: Deployment, api: Api) -> None:
    session = _open(kinds_dep, api)
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Say hello."}],
    }
    session.send({"type": "conversation.item.create", "item": item})
    added = session.until("conversation.item.added")
    assert added["item"]["content"][0]["text"] == "Say hello."
    session.send(
        {
            "type": "response.create",
            "response": {"output_modalities": ["text"], "max_output_tokens": 8},
        }
    )
    done = session.until("response.done")
    assert done["response"]["status"] == "completed", done
    text = session.of("response.output_text.done")[0]["text"]
    assert text and text == "".join(e["delta"] for e in session.of("response.output_text.delta"))
    assert not session.of("response.output_audio.delta")
    assert done["response"]["output"][0]["content"][0] == {"type": "output_text", "text": text}
    session.close()


def test_a_transcription_session_transcribes_and_never_answers(
    kinds_dep: Deployment, api: Api
) -> None:
    session = _open(kinds_dep, api, "intent=transcription")
    assert session.events[0]["session"]["type"] == "transcription"
    session.stream(pcm24(SAID))
    completed = session.until("conversation.item.input_audio_transcription.completed")
    assert "dog" in completed["transcript"].lower(), completed
    session.send({"type": "response.create"})
    error = session.until("error")
    assert error["error"]["param"] == "type", error
    assert "response.created" not in session.types()
    session.close()
    assert _jobs(api, "llm") == []


def test_bad_input_gets_an_error_event_naming_it_and_the_session_goes_on(
    kinds_dep: Deployment, api: Api
) -> None:
    session = _open(kinds_dep, api)

    def refused(event: dict[str, Any] | str) -> dict[str, Any]:
        session.send(event)
        found = session.until("error", timeout_s=30)
        return found["error"]  # type: ignore[no-any-return]

    assert refused("{not json")["param"] == "event"
    assert refused({"type": "no.such.event"})["param"] == "type"
    bad = {
        "type": "session.update",
        "session": {"audio": {"input": {"turn_detection": {"threshold": 2}}}},
    }
    assert refused(bad)["param"] == "session.audio.input.turn_detection.threshold"
    semantic = {
        "type": "session.update",
        "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
    }
    assert refused(semantic)["param"] == "session.audio.input.turn_detection.type"
    voice = refused(
        {"type": "session.update", "session": {"audio": {"output": {"voice": "nobody"}}}}
    )
    assert voice["param"] == "session.audio.output.voice", voice
    assert refused({"type": "input_audio_buffer.append", "audio": "%%%"})["param"] == "audio"
    assert refused({"type": "input_audio_buffer.commit"})["param"] == "input_audio_buffer"
    assert refused({"type": "response.cancel"})["param"] == "response_id"
    assert refused({"type": "conversation.item.create", "item": {"type": "message"}})["param"]
    session.socket.send(b"\x00binary")
    assert session.until("error")["error"]["param"] == "event"
    # A tool the model's chat template cannot render: refused by name when it answers.
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    _configure(session, output_modalities=["text"], tools=[tool])
    text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    session.send({"type": "conversation.item.create", "item": text})
    assert refused({"type": "response.create"})["param"] == "session.tools"
    assert session.until("response.done")["response"]["status"] == "failed"
    # Still served after all of that.
    _configure(session, instructions="Still here.")
    assert session.events[-1]["session"]["instructions"] == "Still here."
    session.close()


def test_the_input_buffer_is_capped_and_says_by_what(kinds_dep: Deployment, api: Api) -> None:
    session = _open(kinds_dep, api)
    _configure(session, audio={"input": {"turn_detection": None}})
    one_second = base64.b64encode(silence(1.0)).decode()
    for _ in range(61):
        session.send({"type": "input_audio_buffer.append", "audio": one_second})
    error = session.until("error")
    assert "realtime.max_buffer_s" in error["error"]["message"], error
    session.send({"type": "input_audio_buffer.clear"})
    session.until("input_audio_buffer.cleared")
    session.close()


def test_keys_client_secrets_and_the_session_cap(kinds_dep: Deployment, api: Api) -> None:
    with pytest.raises(InvalidStatus) as no_key:
        open_session(kinds_dep.base_url, None)
    assert no_key.value.response.status_code == 401
    with pytest.raises(InvalidStatus):
        open_session(kinds_dep.base_url, "ek_unknown", secret=True)
    client = openai.OpenAI(base_url=f"{kinds_dep.base_url}/v1", api_key=api.key, max_retries=0)
    secret = client.realtime.client_secrets.create(
        session={
            "type": "realtime",
            "instructions": "Be brief.",
            "audio": {"output": {"voice": "joe"}},
        },
        expires_after={"anchor": "created_at", "seconds": 60},
    )
    assert secret.value.startswith("ek_") and secret.expires_at > time.time()
    browser = open_session(kinds_dep.base_url, secret.value, secret=True)
    assert browser.socket.subprotocol == "realtime"
    created = browser.next()
    assert created["session"]["instructions"] == "Be brief."
    bad = httpx.post(
        f"{kinds_dep.base_url}/v1/realtime/client_secrets",
        headers={"Authorization": f"Bearer {api.key}"},
        json={"session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}}},
    )
    assert bad.status_code == 422 and "audio.input.format" in bad.json()["error"]["param"], bad.text
    nobody = httpx.post(
        f"{kinds_dep.base_url}/v1/realtime/client_secrets",
        headers={"Authorization": f"Bearer {api.key}"},
        json={"session": {"audio": {"output": {"voice": "nobody"}}}},
    )
    assert nobody.status_code == 422, nobody.text
    assert nobody.json()["error"]["param"] == "session.audio.output.voice", nobody.text
    # The key holds 4 sessions at most (the browser's is one of them).
    others = [_open(kinds_dep, api) for _ in range(3)]
    over = open_session(kinds_dep.base_url, api.key)
    error = over.until("error")
    assert "realtime.max_sessions_per_key" in error["error"]["message"], error
    for session in (browser, *others, over):
        session.close()


def test_a_sessions_events_replay_with_its_turns_stage_times(
    kinds_dep: Deployment, api: Api
) -> None:
    session = _open(kinds_dep, api)
    _configure(session, max_output_tokens=40)
    session.stream(pcm24(SAID))
    session.until("response.done")
    session_id = session.events[0]["session"]["id"]
    assert value(scrape(kinds_dep), "mmq_realtime_sessions_active") >= 1
    for stage in ("vad_tail", "transcript", "llm_first_token", "total"):
        # Counted once the response has ended (after its `response.done`).
        wait_until(
            lambda stage=stage: (
                value(  # type: ignore[misc]
                    scrape(kinds_dep), "mmq_realtime_turn_stage_seconds_count", stage=stage
                )
                >= 1
            ),
            timeout_s=10,
        )
    session.close()
    stored: list[dict[str, Any]] = []
    with api.http.stream("GET", f"/v1/realtime/sessions/{session_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                stored.append(json.loads(line[6:]))
    sent = [e["event_id"] for e in session.events]
    assert [e["event_id"] for e in stored if "event_id" in e][: len(sent)] == sent
    (turn,) = [e for e in stored if e["type"] == "mmq.turn"]
    assert set(turn["seconds"]) >= {"vad_tail", "transcript", "llm_first_token", "total"}, turn
    other = new_owner(kinds_dep.redis_url, kinds_dep.base_url, f"rt-other{time.monotonic_ns()}")
    assert other.http.get(f"/v1/realtime/sessions/{session_id}/events").status_code == 404


def test_speech_during_an_answer_cancels_it_and_aborts_its_jobs(
    kinds_dep: Deployment, api: Api
) -> None:
    session = _open(kinds_dep, api)
    _configure(session, max_output_tokens=600)
    session.stream(pcm24(SAID))
    first_audio = session.until("response.output_audio.delta")
    answering = first_audio["response_id"]
    _configure(session, max_output_tokens=30)  # the next answer, short
    session.stream(pcm24(("Stop, please wait.",)))
    done = session.until(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == answering
    )
    assert done["response"]["status"] == "cancelled", done
    assert done["response"]["status_details"]["reason"] == "turn_detected", done
    types = session.types()
    assert (
        "input_audio_buffer.speech_started" in types[types.index("response.output_audio.delta") :]
    )
    late = [
        e
        for e in session.events[session.events.index(done) :]
        if e["type"] == "response.output_audio.delta" and e["response_id"] == answering
    ]
    assert late == []  # no audio of the canceled answer after its end
    # The interrupting turn is answered in its turn.
    second = session.until("response.done")
    assert second["response"]["id"] != answering and second["response"]["status"] == "completed"
    session.close()

    def ended() -> list[str]:
        statuses = [job["status"] for job in _jobs(api, "llm") + _jobs(api, "tts")]
        return statuses if all(s in ("succeeded", "canceled") for s in statuses) else []

    wait_until(lambda: bool(ended()), timeout_s=30)  # a canceled job stops at its next step
    assert "canceled" in ended()


def test_a_tts_worker_killed_mid_answer_loses_no_audio_and_repeats_none(
    kinds_dep: Deployment, api: Api
) -> None:
    worker = next(p for p in kinds_dep.procs if p.name == "worker-tts" and p.alive())
    r = redis.Redis.from_url(kinds_dep.redis_url, decode_responses=True)
    session = _open(kinds_dep, api)
    _configure(session, max_output_tokens=300)
    session.stream(pcm24(SAID))
    # Freeze the worker while it holds a sentence's job, then kill it there.
    for _ in range(3000):
        worker.kill(signal.SIGSTOP)
        if running_on(r, worker):
            break
        worker.kill(signal.SIGCONT)
        time.sleep(0.01)
    held = running_on(r, worker)
    assert held, "the TTS worker never held a job"
    worker.kill()
    kinds_dep.spawn("worker-tts-again", "worker", "--pipeline", "tts")
    done = session.until("response.done", timeout_s=240)
    assert done["response"]["status"] == "completed", done
    session.close()
    tts = _jobs(api, "tts")
    assert all(job["status"] == "succeeded" for job in tts), [j["status"] for j in tts]
    again = [job for job in tts if job["id"] in held]
    assert again and all(job["attempts"] == 2 for job in again), again
    # Every sentence's audio reached the session once: as many samples as the jobs made.
    made = sum(round(job["output"]["duration_s"] * 24_000) for job in tts)
    assert len(session.audio()) // 2 == pytest.approx(made, rel=0.01)


def _speech_part() -> dict[str, Any]:
    data = base64.b64encode(wav(pcm24(SAID, silence_after_s=0.3))).decode()
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def test_chat_completions_take_speech_and_answer_with_audio(
    kinds_dep: Deployment, api: Api
) -> None:
    """Audio in chat completions, as speaches serves them: through the same stages."""
    oai = openai.OpenAI(base_url=f"{kinds_dep.base_url}/v1", api_key=api.key, max_retries=0)
    heard: Any = [{"role": "user", "content": [_speech_part()]}]
    text = oai.chat.completions.create(model="llm", messages=heard, max_tokens=6)
    assert text.choices[0].message.content
    (asr,) = _jobs(api, "asr")
    asked = _jobs(api, "llm")[0]["input"]["messages"][0]["content"]
    assert asked == asr["output"]["text"].strip() and "fox" in asked.lower(), asked

    spoken = oai.chat.completions.create(
        model="llm", messages=heard, max_tokens=40, modalities=["text", "audio"],
        audio={"voice": "joe", "format": "wav"},
    )  # fmt: skip
    message = spoken.choices[0].message
    assert message.audio is not None and message.audio.transcript
    samples, rate = decode(base64.b64decode(message.audio.data), "wav")
    assert rate == 24_000 and samples.size > rate // 4
    assert spoken.usage is not None and spoken.usage.completion_tokens > 0

    pieces: list[Any] = []  # the client's ChoiceDeltaAudio, each a piece of the answer
    for chunk in oai.chat.completions.create(
        model="llm", messages=heard, max_tokens=40, modalities=["text", "audio"],
        audio={"voice": "joe", "format": "pcm16"}, stream=True,
    ):  # fmt: skip
        audio = chunk.choices[0].delta.audio if chunk.choices else None
        if audio is not None:
            pieces.append(audio)
    transcript = "".join(p.transcript or "" for p in pieces)
    pcm = b"".join(base64.b64decode(p.data) for p in pieces if p.data)
    assert transcript and len(pcm) > 24_000 // 2, (transcript, len(pcm))
    assert pieces[0].id.startswith("audio_") and pieces[0].expires_at > time.time()


def test_chat_audio_asks_that_cannot_be_served_are_refused_by_name(
    kinds_dep: Deployment, api: Api
) -> None:
    oai = openai.OpenAI(base_url=f"{kinds_dep.base_url}/v1", api_key=api.key, max_retries=0)
    say: Any = [{"role": "user", "content": "Hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"modalities": ["text", "audio"]}, "audio"),
        (
            {"modalities": ["text", "audio"], "audio": {"voice": "joe", "format": "mp3"}},
            "audio.format",
        ),
        (
            {
                "modalities": ["text", "audio"],
                "audio": {"voice": "joe", "format": "wav"},
                "stream": True,
            },
            "audio.format",
        ),
        (
            {"modalities": ["text", "audio"], "audio": {"voice": "nobody", "format": "wav"}},
            "audio.voice",
        ),
    ]
    for extra, param in cases:
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            oai.chat.completions.create(model="llm", messages=say, max_tokens=4, **extra)
        assert refused.value.body["param"] == param, (extra, refused.value.body)  # type: ignore[index]
    bad: Any = [
        {
            "role": "user",
            "content": [{"type": "input_audio", "input_audio": {"data": "%%", "format": "wav"}}],
        }
    ]
    with pytest.raises(openai.UnprocessableEntityError) as not_audio:
        oai.chat.completions.create(model="llm", messages=bad, max_tokens=4)
    assert not_audio.value.body["param"] == "messages.0.content.0.input_audio.data"  # type: ignore[index]


def test_a_model_this_deployment_lacks_is_said_at_once(kinds_dep: Deployment, api: Api) -> None:
    session = open_session(kinds_dep.base_url, api.key, "model=no-such-llm")
    assert session.next()["type"] == "session.created"
    error = session.next()
    assert error["type"] == "error" and error["error"]["param"] == "session.model", error
    session.close()
