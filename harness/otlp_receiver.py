"""A real OTLP endpoint on loopback for the tests: it takes `POST /v1/traces` in
HTTP/protobuf as a collector does, decodes each `ExportTraceServiceRequest` with
`opentelemetry-proto`, and keeps every span it was sent (`spans`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from common.procs import free_port
from harness.http_server import serving_http


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    """"" for a root."""
    name: str
    service: str
    attributes: dict[str, Any]
    start_s: float
    end_s: float
    failed: bool


@dataclass
class OtlpReceiver:
    port: int
    received: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.received)

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            service=str(resource.get("service.name", "")),
                            attributes=_attributes(span.attributes),
                            start_s=span.start_time_unix_nano / 1e9,
                            end_s=span.end_time_unix_nano / 1e9,
                            failed=span.status.code == 2,  # STATUS_CODE_ERROR
                        )
                    )
        with self.lock:
            self.received.extend(got)


def _attributes(pairs: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        which = pair.value.WhichOneof("value")
        values[pair.key] = getattr(pair.value, which) if which else None
    return values


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            receiver.take(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def receiving_spans() -> Iterator[OtlpReceiver]:
    """An OTLP endpoint serving on a free loopback port until the block ends."""
    receiver = OtlpReceiver(free_port())
    with serving_http(receiver.port, _handler(receiver)):
        yield receiver
