"""Audio in chat completions, as OpenAI's `gpt-4o-audio` models take and give it, through the
voice pipeline's stages (`realtime.stages`, `realtime.response`):

- an `input_audio` content part is stored and transcribed by an `asr` job; its transcript is
  the text the LLM reads;
- with `modalities: ["text", "audio"]` the answer is spoken too: each complete sentence
  by a `tts` job while the LLM goes on, as in a voice session. Not streamed, the answer's
  message carries the whole audio (`wav` or `pcm16`) and its transcript; streamed, each
  chunk's `delta.audio` carries the next piece of the transcript or of the 24 kHz PCM16.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import time
from collections.abc import AsyncIterator

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import JsonValue

from api import audio_length
from api.error_handlers import error_response
from api.openai.chat_models import ChatRequest, ContentPart, InputAudio
from api.openai.protocol import SSE_DONE
from api.service import JobService
from api.streaming import until_disconnected
from jobs.errors import Conflict, InputError, TooLarge
from jobs.models import JobCreate
from realtime import server_events as ev
from realtime.config import FunctionTool, NamedFunction, ToolChoice
from realtime.conversation import Conversation
from realtime.response import PRIORITY, ResponseParams
from realtime.response import Response as Answer
from realtime.session import wav
from realtime.stages import Followed, StageFailed, cancel_quietly, submit

AUDIO_TTL_S = 3600
"""How long OpenAI keeps an answer's audio for a later turn (`expires_at`); mmq keeps
none: a later turn sends the transcript back."""


async def transcribed(
    service: JobService, owner: str, body: ChatRequest, request: Request | None = None
) -> ChatRequest:
    """`body` with each `input_audio` part replaced by its transcript (a text part); the
    parts are transcribed at once, each by an `asr` job. The parts and their seconds are
    capped first (`limits.chat_max_audio_parts`, `limits.chat_max_audio_seconds`); the
    jobs are canceled when one fails or the client (`request`) goes away."""
    parts = body.audio_parts()
    if not parts:
        return body
    decoded = _checked_parts(service, parts)
    stages: list[Followed] = []
    texts: list[str] | None = None
    try:
        async with _while_connected(request):
            texts = list(
                await asyncio.gather(
                    *(_transcribe(service, owner, f, a, data, stages) for f, a, data in decoded)
                )
            )
    finally:
        for stage in stages:
            if stage.output is None:  # not transcribed, and no longer wanted
                await cancel_quietly(service, owner, stage.job)
    if texts is None:
        raise Conflict("the client went away before its audio was transcribed")
    spoken = dict(zip((field for field, _ in parts), texts, strict=True))
    messages = []
    for i, message in enumerate(body.messages):
        if not isinstance(message.content, list):
            messages.append(message)
            continue
        content = [
            ContentPart(type="text", text=spoken[where])
            if (where := f"messages.{i}.content.{j}.input_audio") in spoken
            else part
            for j, part in enumerate(message.content)
        ]
        messages.append(message.model_copy(update={"content": content}))
    return body.model_copy(update={"messages": messages})


def _checked_parts(
    service: JobService, parts: list[tuple[str, InputAudio]]
) -> list[tuple[str, InputAudio, bytes]]:
    """Each part with its audio decoded, once the request is known to fit its limits."""
    limits = service.settings.limits
    if len(parts) > limits.chat_max_audio_parts:
        raise InputError(
            parts[limits.chat_max_audio_parts][0],
            f"is one of {len(parts)} input_audio parts, over {limits.chat_max_audio_parts} "
            "(limits.chat_max_audio_parts)",
        )
    try:
        service.validate(JobCreate(kind="asr", input={"audio": "x"}))
    except InputError as exc:  # no ASR pipeline here
        raise InputError(parts[0][0], f"cannot be transcribed here: {exc.reason}") from None
    decoded: list[tuple[str, InputAudio, bytes]] = []
    total_s = 0.0
    for field, audio in parts:
        data = _decoded(field, audio, limits.audio_max_bytes)
        total_s += audio_length.seconds_of(data, audio.format) or 0.0
        if total_s > limits.chat_max_audio_seconds:
            raise TooLarge(
                field,
                f"brings the request's audio to {total_s:.1f} s, over "
                f"{limits.chat_max_audio_seconds:g} s (limits.chat_max_audio_seconds)",
            )
        decoded.append((field, audio, data))
    return decoded


def _decoded(field: str, audio: InputAudio, limit: int) -> bytes:
    try:
        data = base64.b64decode(audio.data, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{field}.data", "is not valid base64") from None
    if len(data) > limit:
        raise TooLarge(f"{field}.data", f"is {len(data)} bytes, over the limit of {limit} bytes")
    return data


@contextlib.asynccontextmanager
async def _while_connected(request: Request | None) -> AsyncIterator[None]:
    if request is None:
        yield
        return
    async with until_disconnected(request):
        yield


async def _transcribe(
    service: JobService,
    owner: str,
    field: str,
    audio: InputAudio,
    data: bytes,
    stages: list[Followed],
) -> str:
    content_type = "audio/mpeg" if audio.format == "mp3" else f"audio/{audio.format}"
    stored = await service.files.store(
        owner, io.BytesIO(data), f"said.{audio.format}", content_type
    )
    asr = JobCreate(kind="asr", priority=PRIORITY, input={"audio": stored.key, "beam_size": 1})
    stage = await submit(service, owner, asr)
    stages.append(stage)
    try:
        async for _ in stage.pieces():
            pass
    except StageFailed as exc:
        raise InputError(field, f"could not be transcribed: {exc.message}") from None
    return str((stage.output or {}).get("text") or "").strip()


async def spoken_answer(
    request: Request, service: JobService, owner: str, body: ChatRequest
) -> Response:
    """The answer of a chat request whose `modalities` ask for audio."""
    assert body.audio is not None
    llm_input = body.job_input()
    tools = [
        FunctionTool(
            name=t.function.name,
            description=t.function.description,
            parameters=t.function.parameters,
        )
        for t in body.tools or []
    ]
    choice: ToolChoice = "auto"
    if isinstance(body.tool_choice, str):
        choice = body.tool_choice
    elif body.tool_choice is not None:
        choice = NamedFunction(type="function", name=body.tool_choice.function.name)
    params = ResponseParams(
        llm_model=body.model,
        tts_model=service.settings.realtime.tts_model,
        instructions="",
        modality="audio",
        voice=body.audio.voice,
        speed=1.0,
        max_tokens=int(llm_input.get("max_tokens") or 0),  # type: ignore[arg-type]
        tools=tools,
        tool_choice=choice,
        llm_input=llm_input,
    )
    _check_voice(service, params)
    events: asyncio.Queue[ev.ServerEvent] = asyncio.Queue()

    async def emit(event: ev.ServerEvent) -> None:
        events.put_nowait(event)

    answer = Answer(service, owner, emit, Conversation(), params)
    run = asyncio.create_task(answer.run([]))
    chunks = _Chunks(answer.id, body.model, body.include_usage)
    if body.stream:
        return StreamingResponse(
            _streamed(run, events, chunks),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    try:
        async with until_disconnected(request):
            return await _collect(run, events, chunks, answer, body.audio.format)
    finally:
        if not run.done():  # the client went away: the stages stop
            run.cancel()


def _check_voice(service: JobService, params: ResponseParams) -> None:
    probe = {"model": params.tts_model, "text": "a", "voice": params.voice}
    try:
        service.validate(JobCreate(kind="tts", input=probe))
    except InputError as exc:
        raise InputError("audio." + exc.field.removeprefix("input."), exc.reason) from None


class _Chunks:
    """The answer's pieces as a chat completion's (whole, or streamed as chunks)."""

    def __init__(self, response_id: str, model: str, include_usage: bool) -> None:
        self.id = "chatcmpl-" + response_id.removeprefix("resp_")
        self.audio_id = "audio_" + response_id.removeprefix("resp_")
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.transcript: list[str] = []
        self.pcm: list[bytes] = []
        self.calls: list[JsonValue] = []

    def chunk(
        self, delta: dict[str, JsonValue], finish: str | None = None, usage: JsonValue = None
    ) -> bytes:
        body: dict[str, JsonValue] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
            if delta or finish
            else [],
        }
        if usage is not None:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    def usage(self, done: ev.ServerEvent) -> dict[str, JsonValue] | None:
        response = done.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        assert isinstance(prompt, int) and isinstance(completion, int)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def finish_reason(self, answer_output: dict[str, JsonValue] | None) -> str:
        reason = (answer_output or {}).get("finish_reason")
        return str(reason) if reason else ("tool_calls" if self.calls else "stop")


def _call(item: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """A `function_call` item as a chat completion's tool call."""
    function: dict[str, JsonValue] = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": function}


def _failure(done: ev.ServerEvent) -> JSONResponse | None:
    """The error answer of a response that did not complete (None where it did)."""
    response = done.get("response")
    assert isinstance(response, dict)
    if response.get("status") == "completed":
        return None
    details = response.get("status_details")
    error = details.get("error") if isinstance(details, dict) else None
    message = (
        str(error.get("message")) if isinstance(error, dict) else "the answer did not complete"
    )
    code = str(error.get("code")) if isinstance(error, dict) else str(response.get("status"))
    status = (
        422 if isinstance(error, dict) and error.get("type") == "invalid_request_error" else 500
    )
    return JSONResponse(error_response(code, message).model_dump(), status_code=status)


async def _collect(
    run: asyncio.Task[None],
    events: asyncio.Queue[ev.ServerEvent],
    chunks: _Chunks,
    answer: Answer,
    audio_format: str,
) -> JSONResponse:
    """The whole answer, once its `response.done` came."""
    while True:
        event = await events.get()
        kind = event["type"]
        if kind == "response.output_audio_transcript.delta":
            chunks.transcript.append(str(event["delta"]))
        elif kind == "response.output_audio.delta":
            chunks.pcm.append(base64.b64decode(str(event["delta"])))
        elif kind == "response.output_item.done":
            item = event["item"]
            if isinstance(item, dict) and item.get("type") == "function_call":
                chunks.calls.append(_call(item))

        elif kind == "response.done":
            await run
            failed = _failure(event)
            if failed is not None:
                return failed
            return JSONResponse(_whole(chunks, event, answer, audio_format))


def _whole(
    chunks: _Chunks, done: ev.ServerEvent, answer: Answer, audio_format: str
) -> dict[str, JsonValue]:
    """OpenAI's `chat.completion` of a spoken answer: its message's audio (the whole file,
    base64) and transcript, its tool calls."""
    transcript = "".join(chunks.transcript)
    pcm = b"".join(chunks.pcm)
    audio: JsonValue = None
    if transcript:
        data = wav(pcm) if audio_format == "wav" else pcm
        audio = {
            "id": chunks.audio_id,
            "data": base64.b64encode(data).decode(),
            "expires_at": int(time.time()) + AUDIO_TTL_S,
            "transcript": transcript,
        }
    message: dict[str, JsonValue] = {"role": "assistant", "content": None, "audio": audio}
    if chunks.calls:
        message["tool_calls"] = chunks.calls
    choice: dict[str, JsonValue] = {
        "index": 0,
        "message": message,
        "finish_reason": chunks.finish_reason(answer.llm_output),
        "logprobs": None,
    }
    return {
        "id": chunks.id,
        "object": "chat.completion",
        "created": chunks.created,
        "model": chunks.model,
        "choices": [choice],
        "usage": chunks.usage(done),
    }


async def _streamed(
    run: asyncio.Task[None], events: asyncio.Queue[ev.ServerEvent], chunks: _Chunks
) -> AsyncIterator[bytes]:
    try:
        yield chunks.chunk({"role": "assistant", "content": None})
        audio_opened = False
        while True:
            event = await events.get()
            kind = event["type"]
            piece: dict[str, JsonValue] = {}
            if kind == "response.output_audio_transcript.delta":
                piece = {"transcript": event["delta"]}
            elif kind == "response.output_audio.delta":
                piece = {"data": event["delta"]}
            elif kind == "response.output_item.done":
                item = event["item"]
                if isinstance(item, dict) and item.get("type") == "function_call":
                    call: JsonValue = {"index": len(chunks.calls), **_call(item)}
                    chunks.calls.append(call)
                    yield chunks.chunk({"tool_calls": [call]})
            elif kind == "response.done":
                await run
                failed = _failure(event)
                if failed is not None:
                    yield b"data: " + bytes(failed.body) + b"\n\n"
                else:
                    yield chunks.chunk({}, finish="tool_calls" if chunks.calls else "stop")
                    if chunks.include_usage:
                        yield chunks.chunk({}, usage=chunks.usage(event))
                yield SSE_DONE
                return
            if piece:
                if not audio_opened:
                    piece |= {"id": chunks.audio_id, "expires_at": int(time.time()) + AUDIO_TTL_S}
                    audio_opened = True
                yield chunks.chunk({"audio": piece})
    finally:
        if not run.done():  # the client went away: the stages stop
            run.cancel()
