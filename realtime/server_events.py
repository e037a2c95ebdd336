"""The server events of OpenAI's Realtime API that a session sends, by name and with their
fields (the official client's models in `openai.types.realtime` read every one: the tests
validate each against them). The session gives each its `event_id` as it sends it."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Literal

from pydantic import JsonValue

from realtime.config import SessionConfig

ServerEvent = dict[str, JsonValue]
"""One event as JSON; the protocol is OpenAI's, its names the keys."""
Item = dict[str, JsonValue]
"""A conversation item (`realtime.item`) as JSON."""
ResponseStatus = Literal["in_progress", "completed", "cancelled", "failed", "incomplete"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def session_view(session_id: str, config: SessionConfig, expires_at: int) -> JsonValue:
    """The session as `session.created` / `session.updated` show it: a realtime session
    whole, a transcription session's input audio alone (the fields its type has)."""
    body = config.model_dump(mode="json", exclude={"tracing", "truncation"})
    if config.type == "transcription":
        audio = body["audio"]
        assert isinstance(audio, dict)
        body = {"type": "transcription", "audio": {"input": audio["input"]}}
    body.update({"id": session_id, "object": "realtime.session", "expires_at": expires_at})
    return body


def session_event(
    kind: Literal["session.created", "session.updated"], session: JsonValue
) -> ServerEvent:
    return {"type": kind, "session": session}


def error(
    message: str,
    *,
    param: str | None = None,
    code: str = "invalid_value",
    kind: str = "invalid_request_error",
    event_id: str | None = None,
) -> ServerEvent:
    """An `error` event: `param` names the field at fault, `event_id` the client event."""
    return {
        "type": "error",
        "error": {
            "type": kind,
            "code": code,
            "message": message,
            "param": param,
            "event_id": event_id,
        },
    }


def buffer_event(kind: str, item_id: str | None = None, **fields: JsonValue) -> ServerEvent:
    """`input_audio_buffer.*` events: `committed`, `cleared`, `speech_started` (with
    `audio_start_ms`), `speech_stopped` (with `audio_end_ms`)."""
    event: ServerEvent = {"type": f"input_audio_buffer.{kind}", **fields}
    if item_id is not None:
        event["item_id"] = item_id
    return event


def user_audio_item(item_id: str, transcript: str | None) -> Item:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_audio", "transcript": transcript}],
    }


def assistant_item(item_id: str, modality: str, text: str, status: str) -> Item:
    part: dict[str, JsonValue] = (
        {"type": "output_audio", "transcript": text}
        if modality == "audio"
        else {"type": "output_text", "text": text}
    )
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Item:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def item_event(kind: str, item: Item, previous_item_id: str | None = None) -> ServerEvent:
    """`conversation.item.added`, `.done` or `.created`."""
    return {"type": f"conversation.item.{kind}", "item": item, "previous_item_id": previous_item_id}


def transcription_delta(item_id: str, delta: str) -> ServerEvent:
    return {
        "type": "conversation.item.input_audio_transcription.delta",
        "item_id": item_id,
        "content_index": 0,
        "delta": delta,
    }


def transcription_completed(item_id: str, transcript: str, seconds: float) -> ServerEvent:
    return {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": item_id,
        "content_index": 0,
        "transcript": transcript,
        "usage": {"type": "duration", "seconds": round(seconds, 3)},
    }


def transcription_failed(item_id: str, message: str, code: str) -> ServerEvent:
    return {
        "type": "conversation.item.input_audio_transcription.failed",
        "item_id": item_id,
        "content_index": 0,
        "error": {"type": "transcription_error", "code": code, "message": message},
    }


def response_object(
    response_id: str,
    status: ResponseStatus,
    modality: str,
    voice: str | None,
    output: Sequence[Item] = (),
    usage: dict[str, JsonValue] | None = None,
    reason: str | None = None,
    failure: dict[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """A `realtime.response`: `status_details` says why it ended other than completed."""
    details: dict[str, JsonValue] | None = None
    if status != "in_progress":
        details = {"type": status}
        if reason is not None:
            details["reason"] = reason
        if failure is not None:
            details["error"] = failure
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "status_details": details,
        "output": list(output),
        "output_modalities": [modality],
        "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": voice}},
        "conversation_id": None,
        "usage": usage,
    }


def response_event(kind: Literal["created", "done"], response: JsonValue) -> ServerEvent:
    return {"type": f"response.{kind}", "response": response}


def output_item_event(
    kind: Literal["added", "done"], response_id: str, index: int, item: Item
) -> ServerEvent:
    return {
        "type": f"response.output_item.{kind}",
        "response_id": response_id,
        "output_index": index,
        "item": item,
    }


def content_part_event(
    kind: Literal["added", "done"], where: Where, modality: str, text: str
) -> ServerEvent:
    part: dict[str, JsonValue] = (
        {"type": "audio", "transcript": text}
        if modality == "audio"
        else {"type": "text", "text": text}
    )
    return {"type": f"response.content_part.{kind}", **where.fields(), "part": part}


class Where:
    """Where a response's content goes: its response, output item and content part."""

    def __init__(self, response_id: str, item_id: str, output_index: int) -> None:
        self.response_id = response_id
        self.item_id = item_id
        self.output_index = output_index

    def fields(self) -> dict[str, JsonValue]:
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": self.output_index,
            "content_index": 0,
        }


def delta(kind: str, where: Where, value: str) -> ServerEvent:
    """`response.output_audio.delta`, `.output_audio_transcript.delta` or
    `.output_text.delta` (`kind`: the part after `response.`)."""
    return {"type": f"response.{kind}.delta", **where.fields(), "delta": value}


def audio_done(where: Where) -> ServerEvent:
    return {"type": "response.output_audio.done", **where.fields()}


def transcript_done(where: Where, transcript: str) -> ServerEvent:
    return {
        "type": "response.output_audio_transcript.done",
        **where.fields(),
        "transcript": transcript,
    }


def text_done(where: Where, text: str) -> ServerEvent:
    return {"type": "response.output_text.done", **where.fields(), "text": text}


def arguments_delta(
    response_id: str, item_id: str, index: int, call_id: str, value: str
) -> ServerEvent:
    return {
        "type": "response.function_call_arguments.delta",
        "response_id": response_id,
        "item_id": item_id,
        "output_index": index,
        "call_id": call_id,
        "delta": value,
    }


def arguments_done(
    response_id: str, item_id: str, index: int, call_id: str, name: str, arguments: str
) -> ServerEvent:
    return {
        "type": "response.function_call_arguments.done",
        "response_id": response_id,
        "item_id": item_id,
        "output_index": index,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
