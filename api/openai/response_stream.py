"""A response's `llm` job events as the Responses API's stream: `response.created` (and
`response.queued` for a background response, `response.in_progress` once it runs), then
per output item `output_item.added`, its deltas (`output_text.delta` after
`content_part.added`, `function_call_arguments.delta`) and its `done` events, and at the
end `response.completed`, `response.incomplete` or `response.failed`.

The events are made from the job's stored event log alone, each with its
`sequence_number`, so that the same job always gives the same events: a stream resumed
with `starting_after` replays the log and sends only the events after that number. A job
that runs again (its worker died) streams its text from the start again; only what goes
beyond what was sent is sent (`jobs.delivery.Delivered`), so the response's text is
streamed once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from api.openai import response_objects as objects
from api.openai.response_objects import FunctionCallItem, MessageItem, OutputText
from jobs.delivery import Delivered
from jobs.models import Event, EventType, Job, JobErrorInfo
from jobs.states import JobStatus
from jobstore.responses import ResponseRecord

TEXT = "text"


@dataclass
class _Call:
    output_index: int
    item: FunctionCallItem


class ResponseEvents:
    """The stream of one response, for `stream_job`: each job event's Responses events,
    those numbered above `after` as SSE frames."""

    def __init__(self, job: Job, record: ResponseRecord, after: int = -1) -> None:
        self.job = job
        self.record = record
        self.after = after
        self.seq = -1
        self.delivered = Delivered()
        self.background = bool(record["request"].get("background"))
        self.began = self.running = self.ran = False
        self.outputs = 0
        self.message: tuple[int, MessageItem] | None = None
        self.calls: dict[int, _Call] = {}

    def __call__(self, event: Event) -> Iterator[bytes]:
        for data in self._events(event):
            self.seq += 1
            if self.seq > self.after:
                data["sequence_number"] = self.seq
                yield b"event: %s\ndata: %s\n\n" % (data["type"].encode(), orjson.dumps(data))

    def _events(self, event: Event) -> Iterator[dict[str, Any]]:
        if not self.began:
            self.began = True
            yield from self._begin()
        if event.type is EventType.PARTIAL:
            self.ran = True
            yield from self._running()
            if event.text_at:  # a token's text as the worker wrote it: relayed, not decoded
                literal = self.delivered.take_literal(TEXT, event.text_literal)
                if literal:
                    yield from self._text(orjson.Fragment(literal))
            else:
                yield from self._partial(event.data)
        elif event.type is EventType.OUTPUT:
            yield from self._running()
            yield from self._output(event.data)
        elif event.type is EventType.STATUS:
            status = JobStatus(event.data["status"])
            if status is JobStatus.RUNNING:
                yield from self._running()
            elif status is JobStatus.QUEUED and self.ran:  # its worker died: it runs again
                self.ran = False
                self.delivered.new_attempt()
            elif status.terminal:
                yield from self._end(status, event)

    def _snapshot(self, status: objects.ResponseStatus) -> dict[str, Any]:
        return objects.response_object(self.job, self.record, status).model_dump(mode="json")

    def _begin(self) -> Iterator[dict[str, Any]]:
        if self.background:
            yield {"type": "response.created", "response": self._snapshot("queued")}
            yield {"type": "response.queued", "response": self._snapshot("queued")}
        else:
            yield {"type": "response.created", "response": self._snapshot("in_progress")}
            self.running = True
            yield {"type": "response.in_progress", "response": self._snapshot("in_progress")}

    def _running(self) -> Iterator[dict[str, Any]]:
        if not self.running:
            self.running = True
            yield {"type": "response.in_progress", "response": self._snapshot("in_progress")}

    def _partial(self, data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        if data.get("choice", 0) != 0:
            return
        text = self.delivered.take(TEXT, str(data.get("text") or ""))
        if text:
            yield from self._text(text)
        for delta in data.get("tool_calls") or []:
            index = int(delta.get("index", 0))
            function = delta.get("function") or {}
            if index not in self.calls:
                yield from self._open_call(index, delta.get("id") or "", function.get("name"))
            piece = self.delivered.take(f"call{index}", str(function.get("arguments") or ""))
            if piece:
                call = self.calls[index]
                yield {
                    "type": "response.function_call_arguments.delta",
                    "item_id": call.item.id,
                    "output_index": call.output_index,
                    "delta": piece,
                }

    def _text(self, text: str | orjson.Fragment) -> Iterator[dict[str, Any]]:
        if self.message is None:
            item = MessageItem(id=objects.message_id(self.job.id), status="in_progress", content=[])
            self.message = (self._next_output(), item)
            yield self._item("response.output_item.added", self.message[0], item)
            yield self._part("response.content_part.added", OutputText(text=""))
        index, item = self.message
        if not text:
            return
        yield {
            "type": "response.output_text.delta",
            "item_id": item.id,
            "output_index": index,
            "content_index": 0,
            "delta": text,
            "logprobs": [],
        }

    def _open_call(self, index: int, call_id: str, name: str | None) -> Iterator[dict[str, Any]]:
        item = FunctionCallItem(
            id=objects.call_item_id(self.job.id, index), call_id=call_id, name=name or "",
            arguments="", status="in_progress",
        )  # fmt: skip
        self.calls[index] = _Call(self._next_output(), item)
        yield self._item("response.output_item.added", self.calls[index].output_index, item)

    def _output(self, output: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Each item whole: what was not streamed of it yet, then its `done` events."""
        calls = 0
        for item in objects.output_items(self.job.id, output, "completed"):
            if isinstance(item, MessageItem):
                text = item.content[0].text
                rest = self.delivered.rest(TEXT, text)
                if self.message is None or rest:
                    yield from self._text(rest)
                assert self.message is not None
                index = self.message[0]
                yield {
                    "type": "response.output_text.done",
                    "item_id": item.id,
                    "output_index": index,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
                yield self._part("response.content_part.done", item.content[0])
                yield self._item("response.output_item.done", index, item)
                continue
            if calls not in self.calls:
                yield from self._open_call(calls, item.call_id, item.name)
            call = self.calls[calls]
            rest = self.delivered.rest(f"call{calls}", item.arguments)
            if rest:
                yield {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.id,
                    "output_index": call.output_index,
                    "delta": rest,
                }
            yield {
                "type": "response.function_call_arguments.done",
                "item_id": item.id,
                "output_index": call.output_index,
                "name": item.name,
                "arguments": item.arguments,
            }
            yield self._item("response.output_item.done", call.output_index, item)
            calls += 1
        self.job = self.job.model_copy(update={"output": dict(output)})

    def _end(self, status: JobStatus, event: Event) -> Iterator[dict[str, Any]]:
        ended = {"status": status, "finished_at": event.ts}
        error = event.data.get("error")
        if error:
            ended["error"] = JobErrorInfo.model_validate(error)
        self.job = self.job.model_copy(update=ended)
        response = objects.response_object(self.job, self.record).model_dump(mode="json")
        kind = {"completed": "completed", "incomplete": "incomplete"}.get(response["status"])
        yield {"type": f"response.{kind or 'failed'}", "response": response}

    def _next_output(self) -> int:
        self.outputs += 1
        return self.outputs - 1

    def _item(self, kind: str, index: int, item: MessageItem | FunctionCallItem) -> dict[str, Any]:
        return {"type": kind, "output_index": index, "item": item.model_dump(mode="json")}

    def _part(self, kind: str, part: OutputText) -> dict[str, Any]:
        assert self.message is not None
        index, item = self.message
        return {
            "type": kind,
            "item_id": item.id,
            "output_index": index,
            "content_index": 0,
            "part": part.model_dump(mode="json"),
        }
