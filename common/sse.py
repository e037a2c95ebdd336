"""A small Server-Sent Events parser, shared by the client and the benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass


@dataclass
class SseMessage:
    id: str | None
    event: str
    data: str


class SseParser:
    """Feed lines; get a message at each blank line. Comments (keep-alives) are dropped."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event = "message"
        self._data: list[str] = []
        self._rest = b""

    def feed_bytes(self, data: bytes) -> list[SseMessage]:
        """Feed a piece of the stream as it came off the wire (lines may be cut anywhere);
        get the messages it completed."""
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()
        out = []
        for line in lines:
            message = self.feed(line.decode())
            if message is not None:
                out.append(message)
        return out

    def feed(self, line: str) -> SseMessage | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            self._id = value
        elif field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> SseMessage | None:
        if not self._data:
            self._event = "message"
            return None
        message = SseMessage(self._id, self._event, "\n".join(self._data))
        self._event, self._data = "message", []
        return message


def parse_lines(lines: Iterator[str]) -> Iterator[SseMessage]:
    parser = SseParser()
    for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message


async def aparse_lines(lines: AsyncIterator[str]) -> AsyncIterator[SseMessage]:
    parser = SseParser()
    async for line in lines:
        message = parser.feed(line)
        if message is not None:
            yield message
