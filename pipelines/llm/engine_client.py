"""The adapter over an OpenAI-compatible engine server.

`EngineClient.stream` posts a chat or completion request with `stream: true` and hands the
text of each chunk to a callback as it arrives, then returns the finish reason and usage.
Every stream of a worker runs on one asyncio loop, on a thread of its own, over one
connection pool (`pipelines.llm.http`). The stream is read as bytes: its events are split
at their blank lines (`common.sse.split_data`), each chunk is one `orjson.loads`, and a
chunk that is one choice's text alone (nearly all of them) goes to the sink as that text,
with no object of its own (`DeltaSink.text`). A token costs a parse and a callback, where a
thread per stream (and a synchronous HTTP client in each) cost a switch between threads
for every token, and a worker feeds hundreds of streams at once. Closing a stream early
closes its connection, which vLLM (and `transformers serve`) take as an abort: a canceled
job stops taking a slot in the engine's batch.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar

import orjson
from typing_extensions import TypeIs

from common.sse import DataSplitter
from jobs.errors import InputError
from jobs.outputs import ChatLogprobs, CompletionLogprobs, Logprobs, ToolCallDelta
from pipelines.llm.http import Broken, Pool


class EngineLost(RuntimeError):
    """The engine could not be reached or dropped the stream (it died or restarts)."""


class EngineRefused(RuntimeError):
    """The engine answered the request with an error that is not the request's fault."""


@dataclass
class Finish:
    reasons: dict[int, str]
    """Each choice's finish reason, by its index."""
    usage: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Delta:
    """What one chunk of the engine's stream adds to one choice."""

    text: str
    choice: int = 0
    tool_calls: list[ToolCallDelta] | None = None
    """OpenAI's tool call deltas, as the engine sent them."""
    logprobs: Logprobs | None = None
    """The chunk's log probabilities as the engine sent them: a list of entries (chat), or
    a dict of lists (completions)."""


MMQ_OWN = frozenset({"cache"})
"""The stored request's fields that are mmq's own options, not the engine's."""


class EngineDelta(TypedDict, total=False):
    """What a chat chunk's choice adds (OpenAI's `delta`)."""

    role: str
    content: str | None
    tool_calls: list[ToolCallDelta] | None


class EngineChoice(TypedDict, total=False):
    """A choice of one chunk of the engine's stream: a chat chunk's `delta`, or a
    completion chunk's `text`."""

    index: int
    delta: EngineDelta | None
    text: str | None
    logprobs: ChatLogprobs | CompletionLogprobs | None
    finish_reason: str | None


def request_body(record: Mapping[str, Any], model: str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the engine request for a stored request (`LlmInput.record()`,
    OpenAI's shape, validated once by the API): the request as it is, but for what mmq
    sets: the engine's model name, streaming with usage, and the completions API's
    `logprobs` (the number of top tokens, where the job input says `logprobs` and
    `top_logprobs` as chat does). The API has refused what the engine lacks."""
    body = {k: v for k, v in record.items() if k not in MMQ_OWN}
    body |= {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if "messages" in body:
        return "/v1/chat/completions", body
    top = body.pop("top_logprobs", None)
    if body.pop("logprobs", False):
        body["logprobs"] = top or 0
    return "/v1/completions", body


T = TypeVar("T")


class DeltaSink(Protocol):
    """What a stream's chunks go to, on the client's thread; False stops the stream."""

    def text(self, text: str) -> bool:
        """Choice 0's text, where that is all a chunk's choice adds."""
        ...

    def delta(self, delta: Delta) -> bool:
        """Any other delta (another choice, tool calls, log probabilities)."""
        ...


class EngineClient:
    def __init__(self, base_url: str, read_timeout_s: float, connections: int) -> None:
        self._loop = _new_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="engine-client", daemon=True
        )
        self._thread.start()
        self._pool = Pool(base_url, read_timeout_s, connections)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._pool.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()

    def stream(
        self,
        path: str,
        body: dict[str, Any],
        sink: DeltaSink,
        traceparent: str | None = None,
    ) -> Finish | None:
        """One streamed generation, waited for: `sink` gets each chunk's delta of each
        choice as it arrives. Returns how it finished, or None where `sink` stopped it. Raises
        EngineLost when the engine goes away, InputError when it refuses the request (a
        prompt over its context), EngineRefused for another error answer. `traceparent`
        goes to the engine with the request."""
        return self._run(self._stream(path, body, sink, traceparent))

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _stream(
        self, path: str, body: dict[str, Any], sink: DeltaSink, traceparent: str | None
    ) -> Finish | None:
        stream = _Stream(sink)
        try:
            status = await self._pool.request(path, orjson.dumps(body), stream.feed, traceparent)
        except Broken as exc:
            if stream.stopped:
                return None  # closing the connection aborted the sequence in the engine
            raise EngineLost(f"the engine stream broke: {exc}") from exc
        if status != 200:
            _raise_for(status, stream.error.decode(errors="replace"), path, body)
        if not stream.reasons:
            raise EngineLost("the engine stream ended without a finish reason")
        return Finish(stream.reasons, stream.usage)


class _Stream:
    """One response of the engine: its SSE chunks parsed as they come (`feed`)."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.splitter = DataSplitter()
        self.error = bytearray()
        """The body of an error answer."""
        self.reasons: dict[int, str] = {}
        self.usage: dict[str, int] = {}
        self.done = False
        """`data: [DONE]` came: the rest is read, so that the connection is kept."""
        self.stopped = False
        """The sink said stop."""

    def feed(self, status: int, data: bytes) -> bool:
        if status != 200:
            self.error += data
            return True
        for payload in self.splitter.feed(data):
            if payload == b"[DONE]":
                self.done = True
                continue
            chunk = orjson.loads(payload)
            for choice in chunk.get("choices") or ():
                if not self.done and not self._choice(choice):
                    self.stopped = True
                    return False  # the engine sees the client go: abort
                if choice.get("finish_reason"):
                    self.reasons[choice.get("index", 0)] = choice["finish_reason"]
            if chunk.get("usage"):
                self.usage = {k: int(v) for k, v in chunk["usage"].items() if _count(v)}
        return True

    def _choice(self, choice: EngineChoice) -> bool:
        """Hand on what one choice of a chunk adds; False where the sink said stop."""
        if "delta" in choice:
            delta = choice["delta"] or {}
            text, calls = delta.get("content") or "", delta.get("tool_calls")
        else:
            text, calls = choice.get("text") or "", None
        sent = choice.get("logprobs")
        index = choice.get("index", 0)
        if not calls and not sent and not index:
            return self.sink.text(text) if text else True
        logprobs = _logprobs(sent)
        if not text and not calls and not logprobs:
            return True
        return self.sink.delta(Delta(text, index, calls or None, logprobs or None))


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _prompt_field(path: str) -> str:
    return "messages" if path.endswith("/chat/completions") else "prompt"


def _logprobs(sent: ChatLogprobs | CompletionLogprobs | None) -> Logprobs | None:
    """A chat chunk's entries (sent as `{"content": [...]}`), or the completions API's lists."""
    if sent is not None and _is_chat(sent):
        return sent["content"]
    return sent


def _is_chat(sent: ChatLogprobs | CompletionLogprobs) -> TypeIs[ChatLogprobs]:
    return "content" in sent  # the completions API's lists have no `content`


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _raise_for(status: int, text: str, path: str, body: Collection[str]) -> None:
    message, param = _message(text)
    if status in (400, 413, 422):
        # vLLM answers 400 for a prompt longer than max_model_len, and for bad parameters,
        # naming the parameter where it can: a field of the request (OpenAI's names, which
        # are the input's), or else the prompt.
        field = param if param is not None and param in body else _prompt_field(path)
        raise InputError(field, f"the engine refused the request: {message}")
    raise EngineRefused(f"the engine answered {status}: {message}")


def _message(text: str) -> tuple[str, str | None]:
    """An error answer's message, and the parameter it names, if any."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500], None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        param = error.get("param")
        return str(error.get("message", error))[:500], param if isinstance(param, str) else None
    if isinstance(data, dict) and "message" in data:
        return str(data["message"])[:500], None
    return text[:500], None
