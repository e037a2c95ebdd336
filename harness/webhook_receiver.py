"""A real webhook receiver on loopback for the tests: it records each delivery (its
headers and body) by path, and answers by the path's first word (`flaky` 503 twice, then
200; `gone` 410; `down` 503; `hang` not until it closes; anything else 200)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from common.procs import free_port
from harness.http_server import serving_http


@dataclass
class Receiver:
    port: int
    calls: dict[str, list[tuple[dict[str, str], bytes]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closing: threading.Event = field(default_factory=threading.Event)
    """Set as the receiver closes: the `hang` paths answer then, never before."""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def got(self, path: str) -> list[tuple[dict[str, str], bytes]]:
        with self.lock:
            return list(self.calls.get(path, []))


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            path = self.path.strip("/").split("-")[0]
            with receiver.lock:
                calls = receiver.calls.setdefault(self.path.strip("/"), [])
                calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
                count = len(calls)
            if path == "hang":
                receiver.closing.wait(120)
            status = {"flaky": 503 if count <= 2 else 200, "gone": 410, "down": 503}.get(path, 200)
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver serving on a free loopback port until the block ends."""
    rec = Receiver(free_port())
    with serving_http(rec.port, _handler(rec)):
        try:
            yield rec
        finally:
            rec.closing.set()  # the `hang` paths answer now
