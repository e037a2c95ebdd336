"""`[tracing]`: OpenTelemetry traces of each job across the queue (`telemetry/tracing.py`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TracingSettings(BaseModel):
    enabled: bool = False
    """Export a trace of each job: its admission, its wait in the queue, each run on a
    worker (model load, the wait for a batch, inference, the end's write), the LLM engine's
    request, and its webhook attempts. Off: no span is made, and a job record carries no
    trace context."""
    endpoint: str = "http://127.0.0.1:4318"
    """The OTLP HTTP/protobuf endpoint (an OpenTelemetry Collector, Jaeger, Tempo...):
    spans go to `{endpoint}/v1/traces`."""
    service_name: str = "mmq"
    """`service.name` of every process's spans is this and the process's role
    (`mmq-api`, `mmq-worker`, `mmq-reaper`, `mmq-webhooks`)."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of new traces kept (a client's `traceparent` decides for its own)."""
