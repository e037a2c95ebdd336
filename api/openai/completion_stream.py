"""A chat or text completion's job events as the chunks of OpenAI's stream: the role
first (chat, for each choice), a delta per partial event (its choice's `index`, text, tool
call deltas and log probabilities), each choice's finish reason, the usage where asked
for, an error if the job did not succeed, and `[DONE]` at the end.

Every chunk is one of `api.openai.completion_models`. The delta that is text alone, one
per token, is by far the most frequent: its chunk is the model's JSON made once per
choice with a marker where the text goes, and each delta only encodes its text into it
(`TextDelta`); building and dumping a chunk's three models for each token would cost
the API more CPU than the rest of what it does for one.

A job that runs again (its worker died, or stopped and handed it back) streams its text
from the start again: of each choice's text only what goes beyond what was sent is sent
(`jobs.delivery.Delivered`), so the client reads it once. A token's event comes with its
text as the JSON string the worker wrote (`Event.text_literal`); its frame is that string
spliced into the chunk, and neither the event nor the text is decoded.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel

from api.openai import answers
from api.openai.common import ended_badly
from api.openai.completion_models import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    CompletionChoice,
    CompletionChunk,
    ToolCallDelta,
    Usage,
    call_delta,
)
from api.openai.protocol import SSE_DONE, sse
from jobs.delivery import Delivered
from jobs.models import Event, EventType, Job
from jobs.states import JobStatus

MARK = "\x00"
"""Stands in for a delta's text in its chunk's JSON."""


class TextDelta:
    """The SSE frame of a chunk whose only text is the delta's: `chunk`'s JSON, made once
    with `MARK` as its text, around each delta's text encoded as JSON. The text is the
    last string of the chunk, so the mark's last place is the text's (a model's name
    before it may hold anything)."""

    def __init__(self, chunk: BaseModel) -> None:
        self.head, mark, self.tail = sse(chunk).rpartition(orjson.dumps(MARK))
        if not mark:
            raise ValueError(f"{type(chunk).__name__} does not hold its text's mark")

    def __call__(self, text: str) -> bytes:
        return self.head + orjson.dumps(text) + self.tail

    def literal(self, literal: bytes) -> bytes:
        """The frame of a text given as its JSON string literal (not decoded)."""
        return self.head + literal + self.tail


class _Chunks(ABC):
    """One job's stream chunks: its id, time and model once, and per choice the prepared
    chunk that carries one token's text (`TextDelta`)."""

    chat: bool

    def __init__(self, job: Job, model: str) -> None:
        self.id = answers.completion_id(job.id, chat=self.chat)
        self.created = int(job.created_at)
        self.model = model
        self.texts: dict[int, TextDelta] = {}

    @abstractmethod
    def delta(
        self,
        text: str | None,
        reason: str | None = None,
        *,
        role: bool = False,
        index: int = 0,
        calls: list[ToolCallDelta] | None = None,
        logprobs: Any = None,
    ) -> bytes: ...

    @abstractmethod
    def usage(self, usage: Usage | None) -> bytes: ...

    @abstractmethod
    def _text_chunk(self, index: int) -> BaseModel:
        """The chunk of choice `index` whose text is `MARK`."""

    def _text(self, index: int) -> TextDelta:
        if index not in self.texts:
            self.texts[index] = TextDelta(self._text_chunk(index))
        return self.texts[index]

    def text(self, text: str) -> bytes:
        """The frame of choice 0's next text, alone."""
        return self._text(0)(text)

    def text_literal(self, literal: bytes) -> bytes:
        """As `text`, for the text as its JSON string literal."""
        return self._text(0).literal(literal)


class ChatChunks(_Chunks):
    """One job's `chat.completion.chunk` events."""

    chat = True

    def delta(
        self,
        text: str | None,
        reason: str | None = None,
        *,
        role: bool = False,
        index: int = 0,
        calls: list[ToolCallDelta] | None = None,
        logprobs: Any = None,
    ) -> bytes:
        if text is not None and reason is None and not role and not calls and logprobs is None:
            return self._text(index)(text)
        named: Literal["assistant"] | None = "assistant" if role else None
        delta = ChatDelta(role=named, content=text, tool_calls=calls or None)
        content = None if logprobs is None else ChatLogprobs(content=logprobs)
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=reason, logprobs=content)
        return sse(self._chunk([choice]))

    def usage(self, usage: Usage | None) -> bytes:
        return sse(self._chunk([], usage))

    def _text_chunk(self, index: int) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta=ChatDelta(content=MARK))])

    def _chunk(
        self, choices: list[ChatChunkChoice], usage: Usage | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class TextChunks(_Chunks):
    """One job's `text_completion` events."""

    chat = False

    def delta(
        self,
        text: str | None,
        reason: str | None = None,
        *,
        role: bool = False,
        index: int = 0,
        calls: list[ToolCallDelta] | None = None,
        logprobs: Any = None,
    ) -> bytes:
        if text is not None and reason is None and logprobs is None:
            return self._text(index)(text)
        choice = CompletionChoice(
            index=index, text=text or "", finish_reason=reason, logprobs=logprobs
        )
        return sse(self._chunk([choice]))

    def usage(self, usage: Usage | None) -> bytes:
        return sse(self._chunk([], usage))

    def _text_chunk(self, index: int) -> BaseModel:
        return self._chunk([CompletionChoice(index=index, text=MARK, finish_reason=None)])

    def _chunk(
        self, choices: list[CompletionChoice], usage: Usage | None = None
    ) -> CompletionChunk:
        return CompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class CompletionEvents:
    """A job's events as the chunks of its stream (`view`'s), for `stream_job`."""

    def __init__(
        self, view: ChatChunks | TextChunks, include_usage: bool, params: Mapping[str, str]
    ) -> None:
        self.view = view
        self.include_usage = include_usage
        self.params = params
        self.started: set[int] = set()
        self.delivered = Delivered()
        self.ran = False

    def __call__(self, event: Event) -> Sequence[bytes]:
        if event.text_at and 0 in self.started:
            # The frame of nearly every event: choice 0's next text, as the worker wrote
            # it (a JSON string), spliced into its chunk: nothing decoded, nothing made.
            self.ran = True
            new = self.delivered.take_literal("text:0", event.text_literal)
            return (self.view.text_literal(new),) if new else ()
        if event.type is EventType.PARTIAL and 0 in self.started and _text_alone(event.data):
            # One read back from the job's stream (a replay): decoded.
            self.ran = True
            text = self.delivered.take("text:0", event.data["text"])
            return (self.view.text(text),) if text else ()
        return list(self._frames(event))

    def _frames(self, event: Event) -> Iterator[bytes]:
        view = self.view
        yield from self._role(0)
        if event.type is EventType.PARTIAL:
            self.ran = True
            data = event.data
            index = data.get("choice", 0)
            yield from self._role(index)
            text = str(data.get("text", ""))
            new = self.delivered.take(f"text:{index}", text)
            calls = data.get("tool_calls")
            if new or calls or not text:  # a piece sent before, whole, is not sent again
                logprobs = data.get("logprobs") if new == text else None
                yield view.delta(new, index=index, calls=calls, logprobs=logprobs)
        elif event.type is EventType.STATUS and event.data.get("status") == JobStatus.QUEUED:
            if self.ran:  # it runs again: its text starts over
                self.ran = False
                self.delivered.new_attempt()
        elif event.type is EventType.OUTPUT:
            yield from self._output(event.data)
        elif ended_badly(event):
            status = str(event.data["status"])
            yield sse(answers.failure(status, event.data.get("error"), self.params))
        if event.ends:
            yield SSE_DONE

    def _output(self, output: Mapping[str, Any]) -> Iterator[bytes]:
        view = self.view
        outs = answers.choices_of(output)
        for out in outs:
            index = out.get("index", 0)
            yield from self._role(index)
            if output.get("cached"):  # no partial events: each choice whole at once
                calls = [call_delta(i, c) for i, c in enumerate(out.get("tool_calls") or [])]
                logprobs = out.get("logprobs")
                if view.chat and logprobs is not None:
                    logprobs = logprobs.get("content")
                text = str(out.get("text", ""))
                yield view.delta(text, index=index, calls=calls, logprobs=logprobs)
        for out in outs:
            yield view.delta(None, reason=out.get("finish_reason"), index=out.get("index", 0))
        if self.include_usage:
            usage = output.get("usage")
            yield view.usage(None if usage is None else Usage.model_validate(usage))

    def _role(self, index: int) -> Iterator[bytes]:
        """A chat choice's first chunk names its role."""
        if index not in self.started:
            self.started.add(index)
            if self.view.chat:
                yield self.view.delta("", role=True, index=index)


def _text_alone(data: Mapping[str, Any]) -> bool:
    """Whether a partial's data is choice 0's text alone (`{"index", "text"}`), non-empty."""
    return len(data) == 2 and bool(data.get("text"))
