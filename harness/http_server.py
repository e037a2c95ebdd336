"""A standard-library HTTP server on a loopback port, served from a thread for as long as a
block runs: what the tests' receivers (webhooks, OTLP spans) listen with."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serving_http(port: int, handler: type[BaseHTTPRequestHandler]) -> Iterator[None]:
    """`handler` answering on 127.0.0.1:`port` until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
