"""How much of a job's streamed output a client has had, across the job's attempts.

A job whose worker dies runs again (its lease expires, the reaper queues it) and streams
its partial outputs again from the start. A stream that relays them (an OpenAI chunk
stream, the Responses stream, a voice turn's stage) hands on each piece once: `Delivered`
keeps how much of each of its channels (the answer's text, a tool call's arguments, the
audio) the client has had, and of a new attempt passes on only what goes beyond it, so the
client reads one answer (a rerun that samples other words goes on from where the first
stopped).

An LLM token comes as its JSON string literal (`jobs.models.Event.text_literal`), and is
relayed as it is: `take_literal` measures it only when it must, on a rerun, so the stream
of a job that runs once decodes none of its tokens.
"""

from __future__ import annotations

from typing import TypeVar

import orjson

T = TypeVar("T", str, bytes)

MEASURE_EVERY = 256
"""Literals held unmeasured per channel at most: past this they are measured (one decode
for all of them), so a long stream's memory does not grow with its tokens."""


class Delivered:
    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._attempt: dict[str, int] = {}
        self._unmeasured: dict[str, list[bytes]] = {}
        """Literals passed on whole while this attempt was ahead: counted in both
        `_attempt` and `_sent` once measured."""

    def new_attempt(self) -> None:
        """The job runs again: its streams start over."""
        for channel in list(self._unmeasured):
            self._measure(channel)
        self._attempt.clear()

    def take(self, channel: str, piece: T) -> T:
        """Of `piece` (the next of this attempt's stream), what the client has not had."""
        self._measure(channel)
        start = self._attempt.get(channel, 0)
        end = start + len(piece)
        self._attempt[channel] = end
        sent = self._sent.get(channel, 0)
        if end <= sent:
            return piece[:0]
        self._sent[channel] = end
        return piece[max(0, sent - start) :]

    def take_literal(self, channel: str, literal: bytes) -> bytes:
        """As `take`, for a piece of text given as its JSON string literal: what the client
        has not had, as a literal (b"" for nothing). While this attempt has caught up with
        what was sent (always, for a job that runs once), that is all of it, returned as
        it came, not decoded."""
        if self._attempt.get(channel, 0) >= self._sent.get(channel, 0):
            unmeasured = self._unmeasured.setdefault(channel, [])
            unmeasured.append(literal)
            if len(unmeasured) >= MEASURE_EVERY:
                self._measure(channel)
            return literal
        new = self.take(channel, str(orjson.loads(literal)))
        return orjson.dumps(new) if new else b""

    def rest(self, channel: str, whole: T) -> T:
        """Of the stream's whole value (a job's output), what the client has not had."""
        self._measure(channel)
        sent = self._sent.get(channel, 0)
        self._sent[channel] = max(sent, len(whole))
        return whole[sent:]

    def _measure(self, channel: str) -> None:
        literals = self._unmeasured.pop(channel, None)
        if not literals:
            return
        pieces: list[str] = orjson.loads(b"[" + b",".join(literals) + b"]")
        end = self._attempt.get(channel, 0) + sum(map(len, pieces))
        self._attempt[channel] = end
        self._sent[channel] = max(self._sent.get(channel, 0), end)
