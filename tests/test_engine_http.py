"""The LLM worker's HTTP client to its engine (`pipelines.llm.http` under `EngineClient`),
against real sockets: an engine that goes silent mid-answer is given up after
`request_timeout_s`, one that closes the connection mid-answer is lost, an error answer
is read whole, and a connection whose answer ended carries the next request."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from jobs.errors import InputError
from pipelines.llm.engine_client import Delta, EngineClient, EngineLost, EngineRefused

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
END = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


Answer = Callable[[socket.socket, int], None]
"""What the engine does with its nth connection."""
Serve = Callable[[Answer], str]
"""Starts the engine with an `Answer`; returns its base URL."""


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.fixture
def engine() -> Iterator[Serve]:
    """A one-port server: each accepted connection is handed to `answer` with its number."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[socket.socket] = []

    def serve(answer: Answer) -> str:
        def loop() -> None:
            for n in range(10):
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                connections.append(conn)
                threading.Thread(target=answer, args=(conn, n), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield serve
    listener.close()
    for conn in connections:
        conn.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += conn.recv(65536)
    return head


class Texts:
    """A `DeltaSink` that keeps choice 0's texts."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def text(self, text: str) -> bool:
        self.texts.append(text)
        return True

    def delta(self, delta: Delta) -> bool:
        raise AssertionError(f"a text-only stream gave another delta: {delta}")


def _texts(client: EngineClient) -> list[str]:
    sink = Texts()
    finish = client.stream("/v1/chat/completions", BODY, sink)
    assert finish is not None and finish.reasons == {0: "stop"}
    return sink.texts


def test_a_connection_whose_answer_ended_carries_the_next_request(engine: Serve) -> None:
    accepted: list[int] = []

    def answer(conn: socket.socket, n: int) -> None:
        accepted.append(n)
        for _ in range(3):
            _read_request(conn)
            conn.sendall(HEAD + _chunked(CHUNK) + _chunked(END) + b"0\r\n\r\n")

    client = EngineClient(engine(answer), read_timeout_s=10, connections=4)
    try:
        assert [_texts(client) for _ in range(3)] == [["hi"]] * 3
    finally:
        client.close()
    assert accepted == [0]  # one connection, kept alive


def test_an_engine_silent_mid_answer_is_given_up(engine: Serve) -> None:
    def answer(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(HEAD + _chunked(CHUNK))  # then nothing, the connection open

    client = EngineClient(engine(answer), read_timeout_s=1.5, connections=4)
    started = time.monotonic()
    try:
        with pytest.raises(EngineLost, match="no data from the engine"):
            _texts(client)
    finally:
        client.close()
    assert time.monotonic() - started < 10


def test_an_engine_that_closes_mid_answer_is_lost(engine: Serve) -> None:
    def answer(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        conn.sendall(HEAD + _chunked(CHUNK))
        conn.close()

    client = EngineClient(engine(answer), read_timeout_s=10, connections=4)
    try:
        with pytest.raises(EngineLost, match="closed the connection"):
            _texts(client)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("status", "raised"), [(b"400 Bad Request", InputError), (b"500 Oops", EngineRefused)]
)
def test_an_error_answer_is_read_whole(engine: Serve, status: bytes, raised: type) -> None:
    message = b'{"error": {"message": "prompt too long: ' + b"x" * 3000 + b'"}}'

    def answer(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (status, len(message))
        conn.sendall(head + message[:100])
        time.sleep(0.1)  # the rest in a second piece
        conn.sendall(message[100:])

    client = EngineClient(engine(answer), read_timeout_s=10, connections=4)
    try:
        with pytest.raises(raised, match="prompt too long") as caught:
            _texts(client)
    finally:
        client.close()
    assert "x" * 400 in str(caught.value)  # the message, not its first piece


def test_a_kept_connection_closed_unanswered_sends_the_request_once_more(engine: Serve) -> None:
    served: list[int] = []

    def answer(conn: socket.socket, n: int) -> None:
        _read_request(conn)
        if n == 0:  # the first answer, then the next request is dropped with the connection
            conn.sendall(HEAD + _chunked(CHUNK) + _chunked(END) + b"0\r\n\r\n")
            _read_request(conn)
            conn.close()
            return
        served.append(n)
        conn.sendall(HEAD + _chunked(CHUNK) + _chunked(END) + b"0\r\n\r\n")

    client = EngineClient(engine(answer), read_timeout_s=10, connections=4)
    try:
        assert _texts(client) == ["hi"]
        assert _texts(client) == ["hi"]  # sent again, on connection 1
    finally:
        client.close()
    assert served == [1]
