"""One job's generation as the engine streams it, kept for the job's events and output.

Most chunks of an engine's stream are one choice's text alone. Such text is kept here,
twice: in its choice (for the output, and a rerun's replay) and in what the worker has not
written yet. The worker's event writer takes the latter when it writes next, as one partial
event's data encoded once (`take`): however many tokens came meanwhile, one append per job
per write, and no event object per token. Everything else (several choices, tool call
deltas, log probabilities) goes as one partial event per delta, as `Choices.add` shapes it.
"""

from __future__ import annotations

import threading

import orjson

from jobs.schemas.llm import LlmInput
from pipelines.base import Request
from pipelines.llm.choices import Choices
from pipelines.llm.engine_client import Delta
from pipelines.llm.timing import TokenClock


def streams_text_alone(inp: LlmInput) -> bool:
    """Whether every delta of `inp`'s generation is choice 0's text: one choice, no log
    probabilities, no tools (whose call deltas must keep their place among the text's)."""
    return inp.n == 1 and not inp.logprobs and not (inp.messages is not None and inp.tools)


class Generation:
    """Implements `engine_client.DeltaSink` for one request, on the engine client's thread."""

    def __init__(self, request: Request[LlmInput]) -> None:
        self.request = request
        self.choices = Choices(request.input.n)
        self.clock = TokenClock()
        self._first = self.choices.choices[0]
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._pending_index = 0
        """The index of the first pending delta (the choice's deltas before it)."""
        self._wrote = False
        self._touch = request.stream(self.take) if streams_text_alone(request.input) else None

    def text(self, text: str) -> bool:
        """Choice 0's next piece of text; False stops the stream (the job was canceled)."""
        touch = self._touch
        if touch is None:
            return self.delta(Delta(text))
        if self.request.drop_if_canceled():
            return False
        self.clock.chunk()
        first = self._first
        with self._lock:
            first.deltas += 1
            first.text.append(text)
            self._pending.append(text)
        touch()
        return True

    def delta(self, delta: Delta) -> bool:
        """Any other delta: a partial event of its own."""
        if self.request.drop_if_canceled():
            return False
        self.clock.chunk()
        self.request.partial(self.choices.add(delta))
        return True

    def take(self) -> tuple[bytes, bool, int] | None:
        """The text not written yet as one partial event's data (`jobs.outputs.LlmDelta`,
        its `index` the first pending delta's, its text last), whether it is the job's
        first output, and where in the data the text's JSON string starts."""
        with self._lock:
            if not self._pending:
                return None
            pending, self._pending = self._pending, []
            index, self._pending_index = self._pending_index, self._first.deltas
        first, self._wrote = not self._wrote, True
        head = b'{"index":%d,"text":' % index
        return head + orjson.dumps("".join(pending)) + b"}", first, len(head)
