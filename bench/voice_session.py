"""What `bench.voice` drives a voice session with: questions as Piper speech cut at the end of
their speech, sent at real-time pace, and a session whose events a thread of its own reads
as they arrive; a session's stored `mmq.turn` records."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table
from websockets.exceptions import ConnectionClosed

from harness.realtime import APPEND_MS, RATE, Session, appends, checked, open_session, pcm24
from harness.realtime import silence as silent
from realtime.session import wav

WAIT_S = 180.0
TRAILING_S = 1.5
"""Silence sent after each question: server VAD ends a turn after 500 ms of it."""
AUDIO_DELTA = "response.output_audio.delta"
console = Console(width=150)


# --- audio -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Utterance:
    text: str
    speech: bytes
    """PCM16 at 24 kHz, cut at the end of speech."""
    onset: int
    """The byte where speech starts in it."""

    def pcm(self, silence_s: float) -> bytes:
        return self.speech + silent(silence_s)

    def wav(self) -> bytes:
        return wav(self.speech, RATE)


def utterance(text: str) -> Utterance:
    """`text` spoken by the Piper voice, cut at the end of its speech."""
    samples = np.frombuffer(pcm24((text,), silence_after_s=0.0), dtype="<i2")
    frame = RATE // 100
    count = len(samples) // frame
    frames = samples[: count * frame].astype(np.float64).reshape(count, frame)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (-40 / 20))
    start, end = int(loud[0]) * frame, (int(loud[-1]) + 1) * frame
    return Utterance(text, samples[:end].tobytes(), start * 2)


def send_paced(session: Session, pcm: bytes, marks: Sequence[int]) -> list[float]:
    """`pcm` in 20 ms appends at real-time pace; when the append holding each byte of
    `marks` left."""
    step = RATE * 2 * APPEND_MS // 1000
    wanted = {mark // step for mark in marks}
    sent: dict[int, float] = {}
    started = time.monotonic()
    for i, event in enumerate(appends(pcm)):
        session.send(event)
        if i in wanted:
            sent[i] = time.time()
        time.sleep(max(0.0, started + (i + 1) * APPEND_MS / 1000 - time.monotonic()))
    return [sent[mark // step] for mark in marks]


# --- a session read by a thread of its own ------------------------------------------------


class Live:
    """A realtime session whose events a thread reads as they arrive, each stamped before it
    is checked against the official client's models (a refusal is recorded, not raised), so
    that sending paced audio never delays a reading."""

    def __init__(self, base_url: str, key: str) -> None:
        self.session = open_session(base_url, key)
        self.problems: list[str] = []
        self._changed = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.id: str = self.event(self.wait("session.created"))["session"]["id"]

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.session.events

    def event(self, index: int) -> dict[str, Any]:
        return self.session.events[index]

    def at(self, index: int) -> float:
        return self.session.arrivals[index]

    def _read(self) -> None:
        while True:
            try:
                raw = self.session.socket.recv()
            except ConnectionClosed:
                break
            arrived = time.time()
            try:
                event = checked(raw)
            except Exception as exc:  # a server event the official models refuse: reported
                event = json.loads(raw)
                self.problems.append(f"{event.get('type')}: {exc}"[:300])
            with self._changed:
                self.session.events.append(event)
                self.session.arrivals.append(arrived)
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait(
        self,
        test: str | Callable[[dict[str, Any]], bool],
        start: int = 0,
        timeout_s: float = WAIT_S,
    ) -> int:
        """The index of the first event from `start` for which `test` holds (or of that type)."""
        match = (lambda e: e["type"] == test) if isinstance(test, str) else test
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for i in range(start, len(self.events)):
                    if match(self.events[i]):
                        return i
                start = len(self.events)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    why = "closed" if self._closed else f"none in {timeout_s:g} s"
                    raise TimeoutError(f"{test}: {why}; last {self.session.types()[-8:]}")
                self._changed.wait(remaining)

    def find(self, test: Callable[[dict[str, Any]], bool], start: int = 0) -> list[int]:
        with self._changed:
            return [i for i in range(start, len(self.events)) if test(self.events[i])]

    def configure(self, instructions: str, max_tokens: int) -> None:
        start = len(self.events)
        self.session.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "instructions": instructions,
                    "max_output_tokens": max_tokens,
                    "audio": {
                        "input": {"transcription": {"model": "whisper-1"}},
                        "output": {"voice": "joe"},
                    },
                },
            }
        )
        found = self.event(self.wait(lambda e: e["type"] in ("session.updated", "error"), start))
        if found["type"] == "error":
            raise RuntimeError(f"session.update refused: {found['error']}")

    def close(self) -> None:
        self.session.close()
        self._reader.join(10)


def stored_turns(
    base_url: str, key: str, session_id: str, want: int, timeout_s: float = 10.0
) -> dict[str, dict[str, float]]:
    """The session's `mmq.turn` records (stage seconds by response id), once `want` are in."""
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        while True:
            found: dict[str, dict[str, float]] = {}
            with http.stream("GET", f"/v1/realtime/sessions/{session_id}/events") as response:
                for line in response.iter_lines():
                    record = json.loads(line[6:]) if line.startswith("data: ") else {}
                    if record.get("type") == "mmq.turn":
                        found[record["response_id"]] = record["seconds"]
            if len(found) >= want or time.monotonic() > deadline:
                return found
            time.sleep(0.2)


# --- realtime turns ----------------------------------------------------------------------


# --- report ------------------------------------------------------------------------------


def ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def show(title: str, heads: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for head in heads:
        table.add_column(head, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
