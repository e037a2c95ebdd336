"""Real parts for the storage tests: an S3 API server (moto), a small HTTP server,
deployments with the file pipeline, raw HTTP requests, and process memory readings."""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.procs import free_port
from tuning.deployment import Deployment

MIB = 1024 * 1024
SILENT_S = 30.0
BUCKET = "mmq-test-bucket"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}

FILE_PIPELINE = """
[kinds.filesum]
schema = "harness.filepipes:FileSumInput"

[pipelines.filesum]
kind = "filesum"
impl = "harness.filepipes:FileSumPipeline"
max_batch = 1
concurrency = 2
"""


def add_file_pipeline(dep: Deployment) -> None:
    """Add the `filesum` kind and pipeline to the deployment's config (before starting it)."""
    dep.config_path.write_text(dep.config_path.read_text() + FILE_PIPELINE)


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """A real S3 API server (moto, over HTTP on loopback); yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as patch:
        for name, value in AWS_ENV.items():
            patch.setenv(name, value)
        port = free_port()
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.stop()


def pattern_chunks(total_bytes: int, chunk_bytes: int = MIB) -> Iterator[bytes]:
    """`total_bytes` of a repeating, position-dependent pattern, made chunk by chunk."""
    sent = 0
    while sent < total_bytes:
        size = min(chunk_bytes, total_bytes - sent)
        block = hashlib.sha256(str(sent).encode()).digest() * (size // 32 + 1)
        yield block[:size]
        sent += size


def pattern_sha256(total_bytes: int) -> str:
    sha = hashlib.sha256()
    for chunk in pattern_chunks(total_bytes):
        sha.update(chunk)
    return sha.hexdigest()


def proc_status_kib(pid: int, field: str) -> int:
    """A `/proc/PID/status` memory field (VmRSS, VmHWM) in KiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match, f"no {field} in /proc/{pid}/status"
    return int(match.group(1))


def reset_peak_rss(pid: int) -> None:
    """Make VmHWM start again from the current RSS (Linux: clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def raw_request(base_url: str, method: str, target: str, headers: dict[str, str]) -> int:
    """Send a request line exactly as given (no client-side normalising); the status."""
    host, port = base_url.removeprefix("http://").split(":")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = sock.recv(4096).decode("latin-1")
    return int(head.split(" ", 2)[1])


class _Handler(BaseHTTPRequestHandler):
    """GET /bytes/N (Content-Length), /chunked/N (no length), /redirect?to=URL,
    /drip/N?every=S (N bytes, one every S seconds), /silent (answers nothing for up to
    `SILENT_S`), else 404."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path.startswith("/bytes/"):
            self._send(int(path.rsplit("/", 1)[1]), chunked=False)
        elif path.startswith("/chunked/"):
            self._send(int(path.rsplit("/", 1)[1]), chunked=True)
        elif path.startswith("/drip/"):
            self._drip(int(path.rsplit("/", 1)[1]), float(query.removeprefix("every=")))
        elif path == "/silent":
            time.sleep(SILENT_S)
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", query.removeprefix("to="))
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)

    def _send(self, size: int, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        for chunk in pattern_chunks(size):
            if chunked:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            else:
                self.wfile.write(chunk)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")

    def _drip(self, size: int, every_s: float) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        for _ in range(size):
            try:
                self.wfile.write(b"x")
                self.wfile.flush()
            except OSError:  # the client went away
                return
            time.sleep(every_s)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_server(host: str = "127.0.0.1") -> Iterator[str]:
    """A small HTTP server on `host`; yields its base URL."""
    server = ThreadingHTTPServer((host, 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def file_tree(root: Path) -> list[str]:
    """Every file under `root`, relative, sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
