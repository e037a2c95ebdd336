"""Streamed HTTP/1.1 requests to an engine server, on asyncio protocols.

A worker relays every token of hundreds of sequences, each on its own connection to the
engine. Through aiohttp a token's chunk passed its stream reader, a future's wake-up and an
async iterator before mmq saw it: about 15 µs of CPU per chunk (`bench.llm_ceiling`, 256
streams). Here the chunk goes from the socket to httptools' parser (the one uvicorn uses)
and from its body callback straight to the caller's sink, on the loop's thread: about 8 µs.

`Pool.request` sends one request and hands each piece of the response body, de-chunked,
to the sink as it arrives; it returns when the response ends, or raises `Broken` when the
connection fails or goes silent for `read_timeout_s`. A connection whose response ended is
kept for the next request (keep-alive), up to `connections` at once; closing one before
its response ends is how a stream is aborted (`Exchange.abort`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 5.0
KEEP_IDLE_S = 2.0
"""An idle connection older than this is closed, not reused: servers close theirs after a
few seconds (uvicorn, and so vLLM, after 5), and a request written to a connection the
server is closing would be lost."""
WATCH_INTERVAL_S = 1.0
"""How often connections are checked for a read that has gone silent too long."""


class Broken(ConnectionError):
    """The connection failed, closed, or went silent before the response ended."""


Sink = Callable[[int, bytes], bool]
"""Called with the response's status and each piece of its body, on the loop's thread;
False aborts the request (the connection is closed, and `Pool.request` raises `Broken`)."""


class Exchange(asyncio.Protocol):
    """One connection, carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._sink: Sink | None = None
        self._status = 0
        self._done: asyncio.Future[None] | None = None
        self.reusable = False
        self.closed = False
        self.answered = False
        """Some of the response to the request in flight has come."""
        self.last_read = loop.time()

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(Broken("the engine switched protocols"))
        except httptools.HttpParserError as exc:
            self.fail(Broken(f"the engine's answer is not HTTP/1.1: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end(Broken(f"the engine closed the connection ({exc or 'no error'})"))

    # -- httptools' callbacks

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self._sink is None:  # aborted: the rest of what was read is dropped
            return
        try:
            wanted = self._sink(self._status, body)
        except BaseException as exc:  # the caller's error, raised by `send`
            self.fail(exc)
            return
        if not wanted:
            self.fail(Broken("aborted by the client"))

    def on_message_complete(self) -> None:
        self.reusable = self._parser.should_keep_alive()
        self._end(None)

    # -- one request

    async def send(self, request: bytes, sink: Sink) -> int:
        """Send a request and feed its response to `sink` until the response ends;
        returns its status."""
        assert self._transport is not None
        self._parser = httptools.HttpResponseParser(self)
        self._sink, self._status, self.reusable, self.answered = sink, 0, False, False
        self._done = self._loop.create_future()
        self.last_read = self._loop.time()
        self._transport.write(request)
        try:
            await self._done
        finally:
            self._sink = self._done = None
        return self._status

    def abort(self) -> None:
        """Close the connection now: the engine takes it as the client gone (an abort)."""
        self.reusable = False
        self._sink = None
        if self._transport is not None:
            self._transport.close()

    def fail(self, error: BaseException) -> None:
        """End the request in flight with `error` and close the connection."""
        self._end(error)
        self.abort()

    def silent_for(self, now: float) -> float:
        return now - self.last_read if self._done is not None else 0.0

    def _end(self, error: BaseException | None) -> None:
        done = self._done
        if done is None or done.done():
            return
        if error is None:
            done.set_result(None)
        else:
            self.reusable = False
            done.set_exception(error)


class Pool:
    """Keep-alive connections to one engine, `connections` at most."""

    def __init__(self, base_url: str, read_timeout_s: float, connections: int) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc.rpartition("@")[2]
        self._read_timeout_s = read_timeout_s
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[Exchange] = []
        self._busy: set[Exchange] = set()
        self._watcher: asyncio.Task[None] | None = None

    async def request(
        self, path: str, body: bytes, sink: Sink, traceparent: str | None = None
    ) -> int:
        """POST `body` (JSON) to `path` and feed the response to `sink`; returns its status
        once the response has ended. Raises `Broken` (or what `sink` raised). `traceparent`:
        the W3C trace context the engine's spans join (vLLM takes it)."""
        traced = f"traceparent: {traceparent}\r\n" if traceparent else ""
        head = (
            f"POST {self._prefix}{path} HTTP/1.1\r\nHost: {self._host_header}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{traced}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        async with self._slots:
            exchange, reused = await self._take()
            try:
                return await self._send(exchange, head + body, sink)
            except Broken:
                if not reused or exchange.answered:
                    raise
            # A kept connection the server closed before it read the request (it closes
            # idle ones): the request never reached it, so it goes once more, on a new one.
            exchange, _ = await self._take(fresh=True)
            return await self._send(exchange, head + body, sink)

    async def _send(self, exchange: Exchange, request: bytes, sink: Sink) -> int:
        self._busy.add(exchange)
        try:
            return await exchange.send(request, sink)
        finally:
            self._busy.discard(exchange)
            if exchange.reusable and not exchange.closed:
                self._idle.append(exchange)
            else:
                exchange.abort()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        for exchange in [*self._idle, *self._busy]:
            exchange.abort()
        self._idle.clear()

    async def _take(self, fresh: bool = False) -> tuple[Exchange, bool]:
        """A connection, and whether it served a request before."""
        loop = asyncio.get_running_loop()
        while self._idle and not fresh:
            exchange = self._idle.pop()
            if not exchange.closed and loop.time() - exchange.last_read < KEEP_IDLE_S:
                return exchange, True
            exchange.abort()
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch())
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, exchange = await loop.create_connection(
                    lambda: Exchange(loop), self._host, self._port, ssl=self._ssl
                )
        except (OSError, TimeoutError) as exc:
            raise Broken(f"cannot connect to the engine: {type(exc).__name__}: {exc}") from exc
        return exchange, False

    async def _watch(self) -> None:
        """Abort connections whose response has been silent for `read_timeout_s` (one
        timer for all of them, not one reset at every chunk)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            now = loop.time()
            for exchange in list(self._busy):
                if exchange.silent_for(now) > self._read_timeout_s:
                    exchange.fail(Broken(f"no data from the engine for {self._read_timeout_s}s"))
