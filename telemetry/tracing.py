"""OpenTelemetry traces of each job, one trace per job across the queue (`[tracing]`).

The API's admission span (`mmq.admit`, a child of the client's W3C `traceparent` where it
sent one) is the job's root in mmq; its context is kept in the job record
(`Job.traceparent`), so that the processes that touch the job later make their spans its
children, whatever host they run on:

```
mmq.admit                      API: auth, validation, the store write
├── mmq.queue                  worker: from queued to its start (fair-share holds included)
├── mmq.run  attempt=1         worker: one run (a reaper writes the run of a lost worker)
│   ├── mmq.model_load         an on-demand model loaded for it
│   ├── mmq.batch_wait         waiting for batch mates and a runner
│   ├── mmq.inference          its batch on the device
│   │   └── mmq.engine         LLM: the engine request (its `traceparent` goes to vLLM)
│   └── mmq.finish             its outputs flushed and its end written
└── mmq.webhook attempt=N      the webhook process: each delivery attempt
```

Off by default. Off, `setup` installs nothing: `span` yields None and `record` returns at
once, no trace context is made or stored, so the job path costs what it did.
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from jobs.tracing_settings import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

Attributes = Mapping[str, str | int | float | bool]

_tracer: Tracer | None = None
_request: ContextVar[tuple[str | None, float] | None] = ContextVar("mmq_request", default=None)
"""The request being served here: the client's `traceparent` and when it came."""
_flush: list[Any] = []
"""The provider's `force_flush`, once set up."""


def setup(settings: TracingSettings, role: str) -> None:
    """Export this process's spans (`role`: api, worker, reaper, webhooks) where tracing is
    on; the spans still buffered are sent as the process exits."""
    global _tracer
    if not settings.enabled or _tracer is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create(
        {"service.name": f"{settings.service_name}-{role}", "service.namespace": "mmq"}
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
    )
    exporter = OTLPSpanExporter(endpoint=settings.endpoint.rstrip("/") + "/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    atexit.register(provider.shutdown)
    _flush.append(provider.force_flush)
    _tracer = provider.get_tracer("mmq")


def enabled() -> bool:
    return _tracer is not None


def flush() -> None:
    """Send the spans still buffered (before a process ends without its exit hooks)."""
    for force_flush in _flush:
        force_flush()


def _context(traceparent: str | None) -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent:
        return None
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the span current here; None where tracing is off or no
    span is current."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def span(
    name: str,
    parent: str | None = None,
    attributes: Attributes | None = None,
    *,
    server: bool = False,
) -> Iterator[Span | None]:
    """A span around the block, current inside it: a child of `parent` (a `traceparent`)
    where given, else of the span current here. None where tracing is off, or where there
    is neither."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import INVALID_SPAN, SpanKind, get_current_span

    if parent is None and get_current_span() is INVALID_SPAN:
        yield None  # no trace here to join (a job admitted while tracing was off)
        return
    kind = SpanKind.SERVER if server else SpanKind.INTERNAL
    with _tracer.start_as_current_span(
        name, context=_context(parent), attributes=attributes, kind=kind
    ) as made:
        yield made


def note_request(traceparent: str | None) -> None:
    """The API has a request (its `traceparent` header, if any), starting now: a job it
    admits is traced from here (`admission`)."""
    _request.set((traceparent, time.time()))


@contextmanager
def admission(attributes: Attributes) -> Iterator[Span | None]:
    """The admission span of a job (`mmq.admit`), current inside the block: from its
    request's start (auth and validation included) to the end of the block (the store
    write), a child of the client's `traceparent`."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    parent, start_s = _request.get() or (None, time.time())
    with _tracer.start_as_current_span(
        "mmq.admit", context=_context(parent), attributes=attributes, kind=SpanKind.SERVER,
        start_time=_ns(start_s),
    ) as made:  # fmt: skip
        yield made


def record(
    name: str,
    start_s: float,
    end_s: float,
    attributes: Attributes | None = None,
    *,
    parent: str | None = None,
    error: str | None = None,
) -> None:
    """A span of what already happened, from `start_s` to `end_s` (unix seconds): a child
    of `parent` where given, else of the span current here."""
    if _tracer is None:
        return
    from opentelemetry.trace import Status, StatusCode

    made = _tracer.start_span(
        name, context=_context(parent), attributes=attributes, start_time=_ns(start_s)
    )
    if error is not None:
        made.set_status(Status(StatusCode.ERROR, error))
    made.end(end_time=_ns(max(start_s, end_s)))


def failed(made: Span | None, error: str) -> None:
    """Mark a span of `span` as failed."""
    if made is not None:
        from opentelemetry.trace import Status, StatusCode

        made.set_status(Status(StatusCode.ERROR, error))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
