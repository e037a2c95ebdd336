"""One Realtime session: the client's events in, OpenAI's server events out.

The session keeps the input audio buffer (PCM16 at 24 kHz), runs server VAD over it as it
arrives, and at the end of a turn (VAD, or `input_audio_buffer.commit`) stores the turn's
audio and transcribes it with an ASR job; a conversation session then answers it
(`realtime.response`). Every event it sends also goes to its stored, replayable log
(`SessionLog`), with a `mmq.turn` record of each turn's stage times.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import io
import logging
import time
import wave
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import orjson
from pydantic import JsonValue

from jobs.errors import InputError, MmqError
from jobs.models import JobCreate
from jobs.realtime_settings import RealtimeSettings
from realtime import config as cfg
from realtime import server_events as ev
from realtime.conversation import Conversation, parse_item
from realtime.response import PRIORITY, Response, ResponseParams
from realtime.stages import Jobs, StageFailed, StoreAudio, submit
from realtime.timing import TurnTimes
from security.echo import clip

if TYPE_CHECKING:
    from realtime.vad import VadEvent, VadStream

log = logging.getLogger(__name__)

BYTES_PER_MS = cfg.PCM_RATE * 2 // 1000
MIN_COMMIT_MS = 100
"""OpenAI's floor: a committed buffer holds at least 100 ms of audio."""


class SessionLog(Protocol):
    """Where a session's events are kept (`jobstore.realtime_sessions`)."""

    async def append(self, events: list[str]) -> None: ...

    async def observe(self, stages: dict[str, float]) -> None:
        """Count a turn's stage times in `/metrics`."""


class Checks(Protocol):
    """Validates a job's input as a submit would (`api.service.JobService.validate`)."""

    def validate(self, body: JobCreate) -> object: ...


class Session:
    def __init__(
        self,
        *,
        session_id: str,
        owner: str,
        config: cfg.SessionConfig,
        settings: RealtimeSettings,
        jobs: Jobs,
        checks: Checks,
        store_audio: StoreAudio,
        send: Callable[[str], Awaitable[None]],
        events_log: SessionLog,
        vad: Callable[[cfg.ServerVad], VadStream],
        expires_at: int,
    ) -> None:
        self.id = session_id
        self.owner = owner
        self.config = config
        self.settings = settings
        self.jobs = jobs
        self.checks = checks
        self.store_audio = store_audio
        self.expires_at = expires_at
        self.conversation = Conversation()
        self._send = send
        self._log = events_log
        self._new_vad = vad
        self._vad: VadStream | None = None
        self._buffer = bytearray()
        self._buffer_start_ms = 0
        self._audio_ms = 0
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=512)
        self._turn_item: str | None = None
        self._pending: list[asyncio.Future[None]] = []
        self._response: asyncio.Task[None] | None = None
        self._answer: Response | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._logbox: list[str] = []
        self._closed = False

    # -- sending ---------------------------------------------------------------------

    async def emit(self, event: ev.ServerEvent) -> None:
        """Send `event` (with its `event_id`) and keep it in the session's log."""
        if self._closed:
            return
        event["event_id"] = ev.new_id("event")
        raw = orjson.dumps(event)
        self._outbox.put_nowait(raw.decode())
        if self.settings.store_audio_events or event["type"] != "response.output_audio.delta":
            self._logbox.append(self._stored(event, raw))

    def _stored(self, event: ev.ServerEvent, raw: bytes) -> str:
        """What the log keeps of an event: itself, or past `realtime.max_event_bytes` a
        record of its type and size (an item a client sent can be megabytes)."""
        if len(raw) <= self.settings.max_event_bytes:
            return raw.decode()
        stub = {
            "type": "mmq.event_truncated",
            "event_id": event["event_id"],
            "event_type": event["type"],
            "bytes": len(raw),
        }
        return orjson.dumps(stub).decode()

    async def record(self, record: dict[str, JsonValue]) -> None:
        """A record kept in the log alone (never sent)."""
        self._logbox.append(orjson.dumps(record).decode())

    async def pump(self) -> None:
        """Send what `emit` queued, in order, and write the log behind it (one write for
        whatever queued meanwhile); ends when the session closes."""
        while True:
            text = await self._outbox.get()
            if text is None:
                break
            await self._send(text)
            if self._outbox.empty():
                await self._flush_log()
        await self._flush_log()

    async def _flush_log(self) -> None:
        if self._logbox:
            batch, self._logbox = self._logbox, []
            try:
                await self._log.append(batch)
            except Exception:  # the log is kept best effort: the session goes on
                log.exception("realtime: cannot store session %s's events", self.id)

    # -- the session's life ----------------------------------------------------------

    async def start(self) -> None:
        self._reset_vad()
        await self.emit(ev.session_event("session.created", self._view()))

    async def close(self) -> None:
        """Stop every response and turn, then the sender."""
        if self._response is not None:
            self._response.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in [*self._tasks, *([self._response] if self._response else [])]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._closed = True
        self._outbox.put_nowait(None)

    async def fail(self, message: str, code: str, param: str | None = None) -> None:
        await self.emit(ev.error(message, param=param, code=code))

    def _view(self) -> JsonValue:
        return ev.session_view(self.id, self.config, self.expires_at)

    def _reset_vad(self) -> None:
        detection = self.config.audio.input.turn_detection
        self._vad = self._new_vad(detection) if detection is not None else None

    # -- client events ---------------------------------------------------------------

    async def handle(self, raw: str) -> None:
        """One client event; a bad one gets an `error` event naming its field."""
        event_id: str | None = None
        try:
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise InputError("event", "is not JSON") from None
            if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                raise InputError("type", "an event is a JSON object with a string `type`")
            found = event.get("event_id")
            event_id = found if isinstance(found, str) else None
            handler = self._handlers().get(event["type"])
            if handler is None:
                raise InputError("type", f"unknown or unsupported event type {clip(event['type'])}")
            await handler(event)
        except MmqError as exc:
            param = exc.field if isinstance(exc, InputError) else None
            message = exc.reason if isinstance(exc, InputError) else exc.message
            await self.emit(ev.error(message, param=param, code=exc.code, event_id=event_id))
        except Exception:  # a bug of ours: said, and the session goes on
            log.exception("realtime: session %s could not handle an event", self.id)
            await self.emit(
                ev.error(
                    "the server could not handle this event",
                    code="server_error",
                    kind="server_error",
                    event_id=event_id,
                )
            )

    def _handlers(self) -> dict[str, Callable[[dict[str, JsonValue]], Awaitable[None]]]:
        return {
            "session.update": self._update,
            "input_audio_buffer.append": self._append,
            "input_audio_buffer.commit": self._commit_event,
            "input_audio_buffer.clear": self._clear,
            "conversation.item.create": self._create_item,
            "conversation.item.delete": self._delete_item,
            "conversation.item.retrieve": self._retrieve_item,
            "conversation.item.truncate": self._truncate_item,
            "response.create": self._create_response,
            "response.cancel": self._cancel_response,
        }

    async def _update(self, event: dict[str, JsonValue]) -> None:
        session = event.get("session")
        updated = cfg.merged(self.config, session)
        if updated.type != self.config.type:
            raise InputError("session.type", f"is {self.config.type!r}: a session keeps its type")
        self.check(updated)
        changed_vad = updated.audio.input.turn_detection != self.config.audio.input.turn_detection
        self.config = updated
        if changed_vad:
            self._reset_vad()
        await self.emit(ev.session_event("session.updated", self._view()))

    def check(self, config: cfg.SessionConfig) -> None:
        check_config(config, self.settings, self.checks)

    async def _append(self, event: dict[str, JsonValue]) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise InputError("audio", "must be base64 of PCM16 mono audio at 24 kHz")
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise InputError("audio", "is not valid base64") from None
        limit = int(self.settings.max_buffer_s * 1000) * BYTES_PER_MS
        if len(self._buffer) + len(pcm) > limit:
            raise InputError(
                "audio",
                f"the input audio buffer is full: it holds {self.settings.max_buffer_s:g} s at "
                "most (realtime.max_buffer_s); commit or clear it",
            )
        self._buffer += pcm
        self._audio_ms += len(pcm) // BYTES_PER_MS
        self._arrivals.append((self._audio_ms, time.time()))
        if self._vad is not None:
            for found in self._vad.push(pcm):
                await self._on_vad(found)
            if not self._vad.in_speech:
                self._trim(self._audio_ms - self._padding_ms() - 100)

    def _padding_ms(self) -> int:
        detection = self.config.audio.input.turn_detection
        return detection.prefix_padding_ms if detection is not None else 0

    def _trim(self, from_ms: int) -> None:
        """Drop the buffer's audio before `from_ms` (on the session's audio clock)."""
        cut = (from_ms - self._buffer_start_ms) * BYTES_PER_MS
        if cut > 0:
            del self._buffer[:cut]
            self._buffer_start_ms = from_ms

    async def _on_vad(self, found: VadEvent) -> None:
        detection = self.config.audio.input.turn_detection
        assert detection is not None
        if found.kind == "speech_started":
            self._trim(found.audio_ms - detection.prefix_padding_ms)
            self._turn_item = ev.new_id("item")
            if detection.interrupt_response and self._answering():
                assert self._answer is not None and self._response is not None
                self._answer.cancel_reason = "turn_detected"  # barge-in
                self._response.cancel()
            await self.emit(
                ev.buffer_event("speech_started", self._turn_item, audio_start_ms=found.audio_ms)
            )
            return
        item_id = self._turn_item or ev.new_id("item")
        await self.emit(ev.buffer_event("speech_stopped", item_id, audio_end_ms=found.audio_ms))
        times = TurnTimes(speech_end_arrived=self._arrived(found.audio_ms))
        times.mark("speech_stopped")
        await self._commit(item_id, times, respond=detection.create_response)

    def _answering(self) -> bool:
        return self._response is not None and not self._response.done() and self._answer is not None

    def _arrived(self, audio_ms: int) -> float:
        """When the session received the audio at `audio_ms`."""
        return next((at for end, at in self._arrivals if end >= audio_ms), time.time())

    async def _commit_event(self, _event: dict[str, JsonValue]) -> None:
        if len(self._buffer) < MIN_COMMIT_MS * BYTES_PER_MS:
            raise InputError(
                "input_audio_buffer",
                f"buffer too small: it holds {len(self._buffer) // BYTES_PER_MS} ms of audio, "
                f"at least {MIN_COMMIT_MS} ms are needed",
            )
        await self._commit(self._turn_item or ev.new_id("item"), TurnTimes(), respond=False)

    async def _commit(self, item_id: str, times: TurnTimes, *, respond: bool) -> None:
        """The buffer becomes a user item whose transcript an ASR job makes."""
        pcm, self._buffer = bytes(self._buffer), bytearray()
        self._buffer_start_ms, self._turn_item = self._audio_ms, None
        if self._vad is not None:
            self._vad.reset()
        item = ev.user_audio_item(item_id, None)
        previous = self.conversation.add(item)
        await self.emit(ev.buffer_event("committed", item_id, previous_item_id=previous))
        await self.emit(ev.item_event("added", item, previous))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(done)
        self._spawn(self._transcribe(item, previous, pcm, times, done, respond))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _transcribe(
        self,
        item: ev.Item,
        previous: str | None,
        pcm: bytes,
        times: TurnTimes,
        done: asyncio.Future[None],
        respond: bool,
    ) -> None:
        item_id, transcript = str(item["id"]), ""
        transcription = self.config.audio.input.transcription
        tell = transcription is not None or self.config.type == "transcription"
        options = transcription or cfg.Transcription()
        asr: dict[str, JsonValue] = {
            "model": cfg.asr_of(self.config, self.settings.asr_model),
            "beam_size": 1,
            "language": options.language,
            "initial_prompt": options.prompt,
        }
        try:
            asr["audio"] = await self.store_audio(self.owner, wav(pcm))
            stage = await submit(
                self.jobs, self.owner, JobCreate(kind="asr", priority=PRIORITY, input=asr)
            )
            async for event in stage.pieces():
                segment = event.data.get("segment")
                text = str(segment.get("text", "")) if isinstance(segment, dict) else ""
                piece = stage.delivered.take("text", text)
                if piece and tell:
                    await self.emit(ev.transcription_delta(item_id, piece))
            output = stage.output or {}
            transcript = str(output.get("text") or "").strip()
            times.mark("transcript")
            item["content"] = [{"type": "input_audio", "transcript": transcript}]
            if tell:
                seconds = float(output.get("duration") or len(pcm) / 2 / cfg.PCM_RATE)  # type: ignore[arg-type]
                await self.emit(ev.transcription_completed(item_id, transcript, seconds))
            await self.emit(ev.item_event("done", item, previous))
        except (StageFailed, MmqError) as exc:
            code = exc.code
            await self.emit(ev.transcription_failed(item_id, exc.message, code))
            respond = False
        finally:
            if not done.done():
                done.set_result(None)
            self._pending.remove(done)
        if respond and self.config.type == "realtime" and transcript:
            await self._respond(self._params({}), times)

    async def _clear(self, _event: dict[str, JsonValue]) -> None:
        self._buffer = bytearray()
        self._buffer_start_ms, self._turn_item = self._audio_ms, None
        if self._vad is not None:
            self._vad.reset()
        await self.emit(ev.buffer_event("cleared"))

    async def _create_item(self, event: dict[str, JsonValue]) -> None:
        item = parse_item(event.get("item"))
        if self.conversation.find(str(item["id"])) is not None:
            raise InputError("item.id", f"an item {clip(item['id'])} exists already")
        previous = self.conversation.add(item)
        await self.emit(ev.item_event("added", item, previous))
        await self.emit(ev.item_event("done", item, previous))

    async def _delete_item(self, event: dict[str, JsonValue]) -> None:
        item_id = str(event.get("item_id"))
        if not self.conversation.delete(item_id):
            raise InputError("item_id", f"no item {clip(item_id)} in the conversation")
        await self.emit({"type": "conversation.item.deleted", "item_id": item_id})

    async def _retrieve_item(self, event: dict[str, JsonValue]) -> None:
        item_id = str(event.get("item_id"))
        item = self.conversation.find(item_id)
        if item is None:
            raise InputError("item_id", f"no item {clip(item_id)} in the conversation")
        await self.emit({"type": "conversation.item.retrieved", "item": item})

    async def _truncate_item(self, event: dict[str, JsonValue]) -> None:
        """The client played only `audio_end_ms` of an answer (it was interrupted): kept
        as said, since the audio sent is not kept to cut the transcript against."""
        item_id = str(event.get("item_id"))
        item = self.conversation.find(item_id)
        if item is None or item.get("role") != "assistant":
            raise InputError("item_id", f"no assistant item {clip(item_id)} in the conversation")
        end = event.get("audio_end_ms")
        if not isinstance(end, int) or end < 0:
            raise InputError("audio_end_ms", "must be a whole number of milliseconds")
        await self.emit(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": end,
            }
        )

    async def _create_response(self, event: dict[str, JsonValue]) -> None:
        if self.config.type == "transcription":
            raise InputError("type", "a transcription session makes no responses")
        if self._response is not None and not self._response.done():
            raise InputError(
                "response", "the conversation has an active response already; cancel it first"
            )
        raw = event.get("response") or {}
        if not isinstance(raw, dict):
            raise InputError("response", "must be an object")
        await self._respond(self._params(raw), TurnTimes())

    def _params(self, raw: dict[str, JsonValue]) -> ResponseParams:
        """The session's settings with what `response.create` changed for this response."""
        for name in ("input", "prompt", "reasoning"):
            if raw.get(name) is not None:
                raise InputError(f"response.{name}", "is not served")
        if raw.get("conversation") not in (None, "auto"):
            raise InputError("response.conversation", "only `auto` is served")
        overrides = {
            k: v
            for k, v in raw.items()
            if k
            in ("instructions", "tools", "tool_choice", "max_output_tokens", "output_modalities")
        }
        audio = raw.get("audio")
        if isinstance(audio, dict) and isinstance(out := audio.get("output"), dict):
            overrides["audio"] = {"output": out}
        config = cfg.merged(self.config, overrides, "response") if overrides else self.config
        metadata = raw.get("metadata")
        limit = config.max_output_tokens
        return ResponseParams(
            llm_model=cfg.llm_of(config, self.settings.llm_model),
            tts_model=self.settings.tts_model,
            instructions=config.instructions,
            modality=config.output_modalities[0],
            voice=config.audio.output.voice,
            speed=config.audio.output.speed,
            max_tokens=self.settings.max_output_tokens if limit == "inf" else limit,
            tools=config.tools,
            tool_choice=config.tool_choice,
            metadata={str(k): str(v) for k, v in metadata.items()}
            if isinstance(metadata, dict)
            else None,
        )

    async def _respond(self, params: ResponseParams, times: TurnTimes) -> None:
        if self._response is not None and not self._response.done():
            await asyncio.wait([self._response])  # an answer not interrupted: the next waits
        answer = Response(self.jobs, self.owner, self.emit, self.conversation, params, times)
        self._answer = answer
        waits = list(self._pending)
        self._response = asyncio.create_task(self._answer_then_record(answer, waits))

    async def _answer_then_record(
        self, answer: Response, waits: list[asyncio.Future[None]]
    ) -> None:
        await answer.run(waits)
        await self.record(answer.times.record(answer.id))
        stages = answer.times.stages()
        if answer.times.speech_end_arrived is not None and stages:  # a spoken turn
            try:
                await self._log.observe(stages)
            except Exception:  # counted best effort: the session goes on
                log.exception("realtime: cannot count session %s's turn", self.id)

    async def _cancel_response(self, event: dict[str, JsonValue]) -> None:
        if self._response is None or self._response.done() or self._answer is None:
            raise InputError("response_id", "there is no response in progress to cancel")
        wanted = event.get("response_id")
        if wanted is not None and wanted != self._answer.id:
            raise InputError("response_id", f"{clip(wanted)} is not the response in progress")
        self._answer.cancel_reason = "client_cancelled"
        self._response.cancel()


def check_config(config: cfg.SessionConfig, settings: RealtimeSettings, checks: Checks) -> None:
    """The models and voice a session names exist here (else InputError naming them): the
    ASR model where turns are transcribed, the voice where answers are spoken."""
    probes: list[tuple[JobCreate, str]] = []
    if config.audio.input.transcription is not None or config.type == "transcription":
        asr = {"model": cfg.asr_of(config, settings.asr_model), "audio": "x"}
        probes.append((JobCreate(kind="asr", input=asr), "session.audio.input.transcription"))
    if config.type == "realtime":
        if config.output_modalities == ["audio"]:
            tts = {"model": settings.tts_model, "text": "a", "voice": config.audio.output.voice}
            probes.append((JobCreate(kind="tts", input=tts), "session.audio.output"))
        llm = {"model": cfg.llm_of(config, settings.llm_model), "prompt": "a"}
        probes.append((JobCreate(kind="llm", input=llm), "session"))
    for body, where in probes:
        try:
            checks.validate(body)
        except InputError as exc:
            field = exc.field.removeprefix("input.")
            raise InputError(f"{where}.{field}", exc.reason) from None


def wav(pcm: bytes, rate: int = cfg.PCM_RATE) -> bytes:
    """PCM16 mono as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm)
    return out.getvalue()
