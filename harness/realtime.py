"""What the realtime tests and `bench.voice` drive a voice session with: Piper speech as the
PCM16 at 24 kHz that the Realtime API takes, sent as a client sends a microphone (20 ms
appends), and a session's server events read and checked against the official client's
models (`openai.types.realtime`), each by its own type."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from websockets.sync.client import connect
from websockets.sync.connection import Connection
from websockets.typing import Subprotocol

from harness.audio import speech

RATE = 24_000
APPEND_MS = 20
SERVER_EVENT: TypeAdapter[Any] = TypeAdapter(RealtimeServerEvent)


def pcm24(sentences: tuple[str, ...], silence_after_s: float = 1.5) -> bytes:
    """The sentences spoken by the Piper voice, then silence, as PCM16 mono at 24 kHz."""
    samples, rate = speech(sentences)
    floats = soxr.resample(samples.astype(np.float32) / 32768.0, rate, RATE)
    pcm = np.clip(floats * 32768.0, -32768, 32767).astype("<i2")
    tail = np.zeros(int(silence_after_s * RATE), dtype="<i2")
    return np.concatenate([pcm, tail]).tobytes()


def silence(seconds: float) -> bytes:
    return bytes(int(seconds * RATE) * 2)


def appends(pcm: bytes, ms: int = APPEND_MS) -> Iterator[str]:
    """`input_audio_buffer.append` events of `ms` each."""
    step = RATE * 2 * ms // 1000
    for start in range(0, len(pcm), step):
        chunk = base64.b64encode(pcm[start : start + step]).decode()
        yield json.dumps({"type": "input_audio_buffer.append", "audio": chunk})


def checked(raw: str | bytes) -> dict[str, Any]:
    """A server event, validated by the official client's model of its type (strictly:
    every field of the model it names); `mmq.`-prefixed records are mmq's own."""
    event: dict[str, Any] = json.loads(raw)
    model = SERVER_EVENT.validate_python(event)
    assert model.type == event["type"], (model.type, event["type"])
    return event


@dataclass
class Session:
    """A websocket to `/v1/realtime`, its server events in arrival order (with the time
    each arrived), each checked (`checked`)."""

    socket: Connection
    opened: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    events: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)

    def send(self, event: dict[str, Any] | str) -> None:
        self.socket.send(event if isinstance(event, str) else json.dumps(event))

    def stream(self, pcm: bytes, realtime: float = 0.0) -> float:
        """Append `pcm` in 20 ms events, at `realtime` times real speed (0: at once);
        returns when the last append left."""
        started = time.monotonic()
        for i, event in enumerate(appends(pcm)):
            self.send(event)
            if realtime:
                due = started + (i + 1) * APPEND_MS / 1000 / realtime
                time.sleep(max(0.0, due - time.monotonic()))
        return time.time()

    def next(self, timeout_s: float = 120) -> dict[str, Any]:
        event = checked(self.socket.recv(timeout=timeout_s))
        self.events.append(event)
        self.arrivals.append(time.time())
        return event

    def until(
        self, done: Callable[[dict[str, Any]], bool] | str, timeout_s: float = 180
    ) -> dict[str, Any]:
        """Read events until one for which `done` holds (or of type `done`)."""
        test = (lambda e: e["type"] == done) if isinstance(done, str) else done
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no such event within {timeout_s} s: {self.types()[-20:]}"
            event = self.next(remaining)
            if test(event):
                return event

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def audio(self, response_id: str | None = None) -> bytes:
        """The PCM16 of the answers' audio deltas (one response's, if named)."""
        return b"".join(
            base64.b64decode(e["delta"])
            for e in self.of("response.output_audio.delta")
            if response_id is None or e["response_id"] == response_id
        )

    def close(self) -> None:
        self.opened.close()


def open_session(
    base_url: str, token: str | None, query: str = "", *, secret: bool = False
) -> Session:
    """A session as a server opens one (the key in `Authorization`) or, with `secret`, as a
    browser does (the subprotocol `openai-insecure-api-key.<token>`)."""
    url = base_url.replace("http://", "ws://") + "/v1/realtime" + (f"?{query}" if query else "")
    headers = {"Authorization": f"Bearer {token}"} if token and not secret else None
    protocols = [Subprotocol("realtime"), Subprotocol(f"openai-insecure-api-key.{token}")]
    opened = contextlib.ExitStack()  # closed by `Session.close`
    socket = opened.enter_context(
        connect(
            url,
            additional_headers=headers,
            subprotocols=protocols if secret else None,
            max_size=2**24,
        )
    )
    return Session(socket, opened=opened)
