"""The voice pipeline's parts that need no deployment: what a rerun passes on, sentences,
a session's configuration, the conversation the LLM reads, a turn's stage times."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from api.app import create_app
from harness.inprocess import inprocess_settings
from jobs.delivery import Delivered
from jobs.errors import InputError
from jobstore.api_keys import create_key
from realtime import config as cfg
from realtime.conversation import Conversation, parse_item
from realtime.sentences import Sentences, speakable
from realtime.timing import TurnTimes


def test_a_rerun_passes_on_only_what_goes_beyond_what_was_sent() -> None:
    sent = Delivered()
    assert sent.take("text", "Hello") == "Hello"
    assert sent.take("text", " wor") == " wor"
    sent.new_attempt()  # the worker died: the job streams again from the start
    assert sent.take("text", "Hello") == ""
    assert sent.take("text", " world") == "ld"  # the rerun goes on where the first stopped
    assert sent.take("text", "!") == "!"
    assert sent.rest("text", "Hello world!") == ""
    assert sent.rest("text", "Hello world! More.") == " More."
    audio = Delivered()
    assert audio.take("audio", b"abcd") == b"abcd"
    audio.new_attempt()
    assert audio.take("audio", b"ab") == b""
    assert audio.take("audio", b"cdef") == b"ef"


def test_sentences_end_at_their_stops_and_the_rest_is_flushed() -> None:
    split = Sentences()
    assert split.push("Pi is 3.14 and") == []
    assert split.push(" more. Dr. No") == ["Pi is 3.14 and more."]
    assert split.push(" came home! Then") == ["Dr. No came home!"]
    assert split.flush() == "Then"
    assert split.flush() is None
    assert not speakable("... !") and speakable("a.")


def test_session_update_merges_and_refuses_by_name() -> None:
    base = cfg.SessionConfig()
    updated = cfg.merged(base, {"audio": {"input": {"turn_detection": {"threshold": 0.7}}}})
    detection = updated.audio.input.turn_detection
    assert detection is not None and detection.threshold == 0.7
    assert detection.silence_duration_ms == 500  # the rest kept
    off = cfg.merged(updated, {"audio": {"input": {"turn_detection": None}}})
    assert off.audio.input.turn_detection is None
    for update, field in [
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
         "session.audio.input.turn_detection.type"),
        ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "session.audio.output.format"),
        ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
         "session.audio.input.noise_reduction"),
        ({"output_modalities": ["audio", "text"]}, "session.output_modalities"),
        ({"colour": "red"}, "session.colour"),
    ]:  # fmt: skip
        with pytest.raises(InputError) as refused:
            cfg.merged(base, update)
        assert refused.value.field.startswith(field), (update, refused.value.field)


def test_openai_model_names_mean_the_defaults() -> None:
    session = cfg.merged(cfg.SessionConfig(), {"model": "gpt-realtime", "audio": {"input": {
        "transcription": {"model": "whisper-1"}}}})  # fmt: skip
    assert cfg.llm_of(session, "llm") == "llm" and cfg.asr_of(session, None) is None
    named = cfg.merged(session, {"model": "tiny-chat", "audio": {"input": {
        "transcription": {"model": "asr-large"}}}})  # fmt: skip
    assert cfg.llm_of(named, None) == "tiny-chat" and cfg.asr_of(named, None) == "asr-large"


def test_the_conversation_as_the_llm_reads_it() -> None:
    talk = Conversation()
    talk.add({"id": "a", "type": "message", "role": "user",
              "content": [{"type": "input_audio", "transcript": "Weather in Paris?"}]})  # fmt: skip
    talk.add({"id": "b", "type": "function_call", "call_id": "c1", "name": "get_weather",
              "arguments": '{"city": "Paris"}'})  # fmt: skip
    talk.add(parse_item({"type": "function_call_output", "call_id": "c1", "output": "sunny"}))
    talk.add(parse_item({"type": "message", "role": "user",
                         "content": [{"type": "input_text", "text": "Thanks."}]}))  # fmt: skip
    messages = talk.messages("Be brief.")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[1]["content"] == "Weather in Paris?"
    assert messages[2]["tool_calls"] == [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]  # fmt: skip
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    with pytest.raises(InputError) as bad:
        parse_item({"type": "message", "role": "user", "content": [{"type": "input_audio",
                    "audio": "AAAA"}]})  # fmt: skip
    assert bad.value.field == "item.content.0.audio"


def test_a_turns_stage_times_run_from_the_end_of_speech() -> None:
    times = TurnTimes(speech_end_arrived=10.0, speech_stopped=10.5, transcript=10.8)
    times.llm_first_token, times.first_sentence, times.tts_first_chunk = 11.0, 11.3, 11.4
    stages = times.stages()
    assert stages == pytest.approx({"vad_tail": 0.5, "transcript": 0.3, "llm_first_token": 0.2,
                                    "first_sentence": 0.3, "tts_first_chunk": 0.1,
                                    "total": 1.4})  # fmt: skip
    partial = TurnTimes(llm_first_token=1.0, first_sentence=1.5)
    assert partial.stages() == {"first_sentence": 0.5}


def test_a_session_past_its_longest_life_is_told_why_and_closed(
    redis_url: str, tmp_path: Path
) -> None:
    """The API in this process (Starlette's test client speaks the websocket), no worker: a
    session lives `realtime.max_session_s`, then an error event names the limit."""
    settings = inprocess_settings(redis_url, tmp_path)
    settings.realtime.max_session_s = 1.0
    key = create_key(redis.Redis.from_url(redis_url, decode_responses=True), "short-lived")
    with (
        TestClient(create_app(settings)) as client,
        client.websocket_connect("/v1/realtime", headers={"Authorization": f"Bearer {key}"}) as ws,
    ):
        assert ws.receive_json()["type"] == "session.created"
        error = ws.receive_json()
        assert error["type"] == "error", error
        assert "realtime.max_session_s" in error["error"]["message"], error
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
