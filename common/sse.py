"""Small Server-Sent Events parsers: `SseParser` (messages with their fields), shared by
the client and the benchmarks, and `DataSplitter` (the `data` of each event, as bytes),
for a worker that relays an engine's stream token by token."""

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


class DataSplitter:
    """Feed a stream's bytes as they come; get the `data` of each event they completed, as
    bytes (lines joined with a newline). No object per line: an event that is one `data:`
    line (every engine's chunk) is one slice. Comments and other fields are dropped."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._rest + data if self._rest else data
        held = b""
        if b"\r" in buf:  # CRLF or CR line ends, normalized; a CR at the end may be a CRLF's
            if buf.endswith(b"\r"):
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events = buf.split(b"\n\n")
        self._rest = events.pop() + held
        out = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                out.append(event[6:])
                continue
            lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(line[1:] if line[:1] == b" " else line for line in lines))
        return out
