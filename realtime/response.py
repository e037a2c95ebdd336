"""One response of a session: the LLM's answer streamed as it comes, each complete sentence
spoken by a TTS job of its own as soon as it is complete (while the LLM goes on), and the
audio sent in the sentences' order as each is made.

Canceled (`response.cancel`, or speech that starts during it), it cancels its LLM and TTS
jobs, which aborts their work in the engine and the voice, and ends `cancelled` with what
was sent so far.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import JsonValue

from jobs.errors import InputError, MmqError
from jobs.models import Job, JobCreate
from jobs.settings import Priority
from realtime import server_events as ev
from realtime.config import FunctionTool, ToolChoice
from realtime.conversation import Conversation
from realtime.sentences import Sentences, speakable
from realtime.stages import Followed, Jobs, StageFailed, cancel_quietly, pcm_of, submit
from realtime.timing import TurnTimes

log = logging.getLogger(__name__)

Emit = Callable[[ev.ServerEvent], Awaitable[None]]
DELTA_BYTES = 24_000 * 2 // 10
"""An audio delta holds 100 ms at most: a voice makes a sentence's audio at once, and a
client that plays each delta as it comes starts sooner on small ones."""
PRIORITY: Priority = "high"
"""Every stage of a voice turn is interactive work."""


@dataclass
class ResponseParams:
    """What a response is asked for: the session's settings, less what `response.create`
    changed for this one."""

    llm_model: str | None
    tts_model: str | None
    instructions: str
    modality: str
    voice: str | None
    speed: float
    max_tokens: int
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    metadata: dict[str, str] | None = None
    llm_input: dict[str, JsonValue] | None = None
    """The `llm` job's whole input, where the caller made it (a chat completion with
    audio: its messages and sampling as the client sent them)."""


class Response:
    def __init__(
        self,
        jobs: Jobs,
        owner: str,
        emit: Emit,
        conversation: Conversation,
        params: ResponseParams,
        times: TurnTimes | None = None,
    ) -> None:
        self.id = ev.new_id("resp")
        self.jobs = jobs
        self.owner = owner
        self.emit = emit
        self.conversation = conversation
        self.params = params
        self.times = times or TurnTimes()
        self.cancel_reason = "client_cancelled"
        """`turn_detected` when speech interrupted it."""
        self._started: list[Job] = []
        self._text = ""
        self._where = ev.Where(self.id, ev.new_id("item"), 0)
        self._opened = False
        self._output: list[ev.Item] = []
        self._spoken: list[asyncio.Queue[bytes | None]] = []
        self._tts: list[asyncio.Task[None]] = []
        self._more = asyncio.Event()
        self._answered = False
        self._player: asyncio.Task[None] | None = None
        self.llm_output: dict[str, JsonValue] | None = None
        """The `llm` job's output, once it has ended (its finish reason, usage, calls)."""

    async def run(self, waits: list[asyncio.Future[None]]) -> None:
        """The whole response, once the transcripts it answers (`waits`) are in."""
        await self.emit(ev.response_event("created", self._object("in_progress")))
        try:
            for wait in waits:
                with contextlib.suppress(Exception):
                    await wait
            usage, calls = await self._answer()
            await self._finish(calls)
            await self.emit(ev.response_event("done", self._object("completed", usage=usage)))
        except asyncio.CancelledError:
            await self._stop()
            await self.emit(
                ev.response_event("done", self._object("cancelled", reason=self.cancel_reason))
            )
        except (StageFailed, MmqError) as exc:
            await self._stop()
            if isinstance(exc, InputError):  # the session asked for what the LLM cannot do
                param = "session." + exc.field.removeprefix("input.")
                await self.emit(ev.error(exc.reason, param=param, code=exc.code))
            failure: dict[str, JsonValue] = {
                "type": "server_error" if isinstance(exc, StageFailed) else "invalid_request_error",
                "code": exc.code,
                "message": exc.message,
            }
            await self.emit(ev.response_event("done", self._object("failed", failure=failure)))

    async def _answer(self) -> tuple[dict[str, JsonValue], list[JsonValue]]:
        params = self.params
        body = JobCreate(kind="llm", priority=PRIORITY, input=self._llm_input())
        llm = await submit(self.jobs, self.owner, body)
        self._started.append(llm.job)
        sentences = Sentences()
        async for event in llm.pieces():
            await self._say(llm.delivered.take("text", str(event.data.get("text", ""))), sentences)
        output = self.llm_output = llm.output or {}
        await self._say(llm.delivered.rest("text", str(output.get("text") or "")), sentences)
        if params.modality == "audio":
            rest = sentences.flush()
            if rest is not None:
                self._speak(rest)
        self._answered = True
        self._more.set()
        if self._player is not None:
            await self._player
        usage = output.get("usage")
        calls = output.get("tool_calls")
        return _usage(usage if isinstance(usage, dict) else {}), calls if isinstance(
            calls, list
        ) else []

    def _llm_input(self) -> dict[str, JsonValue]:
        params = self.params
        if params.llm_input is not None:
            return params.llm_input
        llm: dict[str, JsonValue] = {
            "model": params.llm_model,
            "messages": self.conversation.messages(params.instructions),  # type: ignore[dict-item]
            "max_tokens": params.max_tokens,
            "temperature": 0.8,
        }
        if params.tools and params.tool_choice != "none":
            llm["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                for t in params.tools
            ]
            choice = params.tool_choice
            llm["tool_choice"] = (
                choice
                if isinstance(choice, str)
                else {"type": "function", "function": {"name": choice.name}}
            )
        return llm

    async def _say(self, piece: str, sentences: Sentences) -> None:
        """A piece of the answer's text: sent as a delta, and spoken once its sentence ends."""
        if not piece:
            return
        self.times.mark("llm_first_token")
        await self._open()
        self._text += piece
        kind = "output_audio_transcript" if self.params.modality == "audio" else "output_text"
        await self.emit(ev.delta(kind, self._where, piece))
        if self.params.modality == "audio":
            for sentence in sentences.push(piece):
                self._speak(sentence)

    async def _open(self) -> None:
        if self._opened:
            return
        self._opened = True
        modality = self.params.modality
        item = ev.assistant_item(self._where.item_id, modality, "", "in_progress")
        await self.emit(ev.output_item_event("added", self.id, 0, item))
        await self.emit(ev.content_part_event("added", self._where, modality, ""))

    def _speak(self, sentence: str) -> None:
        if not speakable(sentence):
            return
        self.times.mark("first_sentence")
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._spoken.append(chunks)
        self._tts.append(asyncio.create_task(self._synthesize(sentence, chunks)))
        if self._player is None:
            self._player = asyncio.create_task(self._play())
        self._more.set()

    async def _synthesize(self, sentence: str, chunks: asyncio.Queue[bytes | None]) -> None:
        """One sentence as a TTS job; its audio into `chunks`, then None."""
        params = self.params
        tts_input: dict[str, JsonValue] = {
            "model": params.tts_model,
            "text": sentence,
            "voice": params.voice,
            "speed": params.speed,
            "format": "pcm",
            "sample_rate": 24_000,
        }
        try:
            tts: Followed = await submit(
                self.jobs, self.owner, JobCreate(kind="tts", priority=PRIORITY, input=tts_input)
            )
            self._started.append(tts.job)
            async for event in tts.pieces():
                pcm = tts.delivered.take("audio", pcm_of(event.data))
                if pcm:
                    chunks.put_nowait(pcm)
        except (StageFailed, MmqError) as exc:
            log.warning("realtime: a sentence was not spoken: %s", exc)
        finally:
            chunks.put_nowait(None)

    async def _play(self) -> None:
        """The sentences' audio in their order, each chunk as it is made."""
        played = 0
        while True:
            if played < len(self._spoken):
                chunks = self._spoken[played]
                while (pcm := await chunks.get()) is not None:
                    self.times.mark("tts_first_chunk")
                    for start in range(0, len(pcm), DELTA_BYTES):
                        piece = base64.b64encode(pcm[start : start + DELTA_BYTES]).decode()
                        await self.emit(ev.delta("output_audio", self._where, piece))
                played += 1
            elif self._answered:
                return
            else:
                self._more.clear()
                await self._more.wait()

    async def _finish(self, calls: list[JsonValue]) -> None:
        """The answer's closing events, then each function call as an item of its own."""
        modality = self.params.modality
        if self._opened:
            where = self._where
            if modality == "audio":
                await self.emit(ev.audio_done(where))
                await self.emit(ev.transcript_done(where, self._text))
            else:
                await self.emit(ev.text_done(where, self._text))
            await self.emit(ev.content_part_event("done", where, modality, self._text))
            item = ev.assistant_item(where.item_id, modality, self._text, "completed")
            await self._close_item(item, 0)
        for call in calls:
            if not isinstance(call, dict) or not isinstance(fn := call.get("function"), dict):
                continue
            index = len(self._output)
            call_id, name = str(call.get("id") or ev.new_id("call")), str(fn.get("name"))
            arguments = str(fn.get("arguments") or "{}")
            item_id = ev.new_id("item")
            pending = ev.function_call_item(item_id, call_id, name, "", "in_progress")
            await self.emit(ev.output_item_event("added", self.id, index, pending))
            await self.emit(ev.arguments_delta(self.id, item_id, index, call_id, arguments))
            await self.emit(ev.arguments_done(self.id, item_id, index, call_id, name, arguments))
            done = ev.function_call_item(item_id, call_id, name, arguments, "completed")
            await self._close_item(done, index)

    async def _close_item(self, item: ev.Item, index: int) -> None:
        self._output.append(item)
        previous = self.conversation.add(item)
        await self.emit(ev.output_item_event("done", self.id, index, item))
        await self.emit(ev.item_event("done", item, previous))

    async def _stop(self) -> None:
        """Stop every stage: the player, the sentences, the jobs (aborted where they run);
        what was said so far stays in the conversation, marked incomplete."""
        for task in [*self._tts, *([self._player] if self._player else [])]:
            task.cancel()
        for job in self._started:
            await cancel_quietly(self.jobs, self.owner, job)
        if self._opened and not self._output:
            item = ev.assistant_item(
                self._where.item_id, self.params.modality, self._text, "incomplete"
            )
            self._output.append(item)
            self.conversation.add(item)
            await self.emit(ev.output_item_event("done", self.id, 0, item))

    def _object(
        self,
        status: ev.ResponseStatus,
        usage: dict[str, JsonValue] | None = None,
        reason: str | None = None,
        failure: dict[str, JsonValue] | None = None,
    ) -> JsonValue:
        params = self.params
        made = ev.response_object(
            self.id, status, params.modality, params.voice, self._output, usage, reason, failure
        )
        if params.metadata:
            made["metadata"] = dict(params.metadata)
        return made


def _usage(llm: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The LLM job's usage as a Realtime response's (all of it text)."""
    prompt = llm.get("prompt_tokens")
    completion = llm.get("completion_tokens")
    inputs = prompt if isinstance(prompt, int) else 0
    outputs = completion if isinstance(completion, int) else 0
    return {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
        "input_token_details": {"text_tokens": inputs, "audio_tokens": 0, "cached_tokens": 0},
        "output_token_details": {"text_tokens": outputs, "audio_tokens": 0},
    }
