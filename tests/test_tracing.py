"""Traces of jobs across the queue (`[tracing]`), exported over OTLP HTTP/protobuf to a real
endpoint that decodes `opentelemetry-proto`'s requests (`harness.otlp_receiver`): real API,
workers, reaper, webhook process and Redis. A job's spans form one trace under the client's
`traceparent`, with the right parents, from every process that touched it; an LLM job's
engine request carries its trace to the engine; a worker SIGKILLed mid-job leaves two run
spans, attempts 1 and 2."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from common.procs import free_port
from harness.api_client import Api, new_owner
from harness.kinds import llm_toml
from harness.otlp_receiver import OtlpReceiver, ReceivedSpan, receiving_spans
from harness.webhook_receiver import Receiver, receiving
from tests.conftest import WEBHOOK_SECRET
from tuning.deployment import Deployment, flush, responds, running_on, serving, wait_until


class Traced:
    def __init__(self, dep: Deployment, spans: OtlpReceiver, hooks: Receiver, engine: str):
        self.dep = dep
        self.otlp = spans
        self.hooks = hooks
        self.engine_url = engine

    def trace(self, trace_id: str, names: set[str], timeout_s: float = 30) -> list[ReceivedSpan]:
        """The spans of `trace_id`, once those named `names` have all come."""

        def complete() -> bool:
            return names <= {s.name for s in self.otlp.spans() if s.trace_id == trace_id}

        wait_until(complete, timeout_s=timeout_s)
        return [s for s in self.otlp.spans() if s.trace_id == trace_id]


@pytest.fixture(scope="module")
def traced(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    flush(redis_url)
    with receiving_spans() as spans, receiving() as hooks:
        port = free_port()
        env = {
            "MMQ_TRACING__ENABLED": "true",
            "MMQ_TRACING__ENDPOINT": spans.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans leave each process within 0.1 s
            "MMQ_WEBHOOKS__SECRET": WEBHOOK_SECRET,
            "MMQ_NET__ALLOW_PRIVATE_ADDRESSES": "true",
            "MMQ_LEASE__TTL_S": "3",
            "MMQ_LEASE__HEARTBEAT_S": "0.5",
        }
        dep = Deployment(redis_url, tmp_path_factory.mktemp("traced"), env_overrides=env)
        wire = {"engine": "url", "engine_url": f"http://127.0.0.1:{port}", "max_inflight": 4}
        dep.config_path.write_text(
            dep.config_path.read_text() + llm_toml("wire", "synthetic", wire)
        )
        with serving(dep):
            engine = dep.launch(
                "engine", [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port)]
            )
            engine_url = f"http://127.0.0.1:{port}"
            wait_until(lambda: responds(f"{engine_url}/health"), engine, timeout_s=30)
            worker = dep.spawn("worker-wire", "worker", "--pipeline", "wire")
            webhooks = dep.spawn("webhooks", "webhooks")
            dep.start(["echo", "sleep"])  # all at once, then waited for together
            dep.wait_started([worker, webhooks])
            yield Traced(dep, spans, hooks, engine_url)


@pytest.fixture
def api(traced: Traced) -> Api:
    return new_owner(traced.dep.redis_url, traced.dep.base_url, f"tr{time.monotonic_ns()}")


def _client_context() -> tuple[str, str, dict[str, str]]:
    """A client's trace id, span id and `traceparent` header."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    (found,) = [s for s in spans if s.name == name]
    return found


def test_a_job_s_spans_form_one_trace_under_the_client_s_from_every_process(
    traced: Traced, api: Api
) -> None:
    trace_id, client_span, headers = _client_context()
    path = f"traced-{time.monotonic_ns()}"
    body: dict[str, Any] = {
        "kind": "echo", "input": {"text": "hi"}, "webhook": {"url": traced.hooks.url(path)},
    }  # fmt: skip
    r = api.http.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    names = {"mmq.admit", "mmq.queue", "mmq.run", "mmq.batch_wait", "mmq.inference",
             "mmq.finish", "mmq.webhook"}  # fmt: skip
    spans = traced.trace(trace_id, names)
    admit = _one(spans, "mmq.admit")
    assert admit.parent_id == client_span and admit.service == "mmq-api"
    assert admit.attributes["mmq.job_id"] == job_id
    assert admit.attributes["mmq.pipeline"] == "echo"
    run = _one(spans, "mmq.run")
    for child in ("mmq.queue", "mmq.run", "mmq.webhook"):
        assert _one(spans, child).parent_id == admit.span_id, child
    for phase in ("mmq.batch_wait", "mmq.inference", "mmq.finish"):
        assert _one(spans, phase).parent_id == run.span_id, phase
    assert run.service == "mmq-worker" and _one(spans, "mmq.webhook").service == "mmq-webhooks"
    assert run.attributes["mmq.attempt"] == 1 and run.attributes["mmq.status"] == "succeeded"
    assert run.attributes["mmq.pipeline"] == "echo" and run.attributes["mmq.device"] == "cpu"
    assert run.attributes["mmq.batch_size"] >= 1 and run.attributes["mmq.job_id"] == job_id
    # The queue span is the job's wait as its record has it: it ends when the job started.
    started_at = datetime.fromisoformat(api.http.get(f"/v1/jobs/{job_id}").json()["started_at"])
    assert _one(spans, "mmq.queue").end_s == pytest.approx(started_at.timestamp(), abs=1e-5)
    # The webhook itself is the job's, signed, as without tracing.
    ((hook_headers, hook_body),) = traced.hooks.got(path)
    assert Webhook(WEBHOOK_SECRET).verify(hook_body, hook_headers)["job_id"] == job_id


def test_an_llm_job_s_engine_request_carries_its_trace_to_the_engine(
    traced: Traced, api: Api
) -> None:
    trace_id, _, headers = _client_context()
    marker = f"traced-{time.monotonic_ns()}"
    body = {"model": "wire", "messages": [{"role": "user", "content": marker}], "max_tokens": 3}
    r = api.http.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    spans = traced.trace(trace_id, {"mmq.admit", "mmq.run", "mmq.engine"})
    engine = _one(spans, "mmq.engine")
    assert engine.parent_id == _one(spans, "mmq.run").span_id
    received = httpx.get(f"{traced.engine_url}/requests", timeout=5).json()
    (sent,) = [got for got in received if marker in str(got["body"])]
    assert sent["traceparent"] == f"00-{trace_id}-{engine.span_id}-01"


def test_a_job_untraced_by_its_client_gets_a_trace_of_its_own(traced: Traced, api: Api) -> None:
    job = api.submit("echo", text="no context")
    api.wait(job["id"])

    def traced_job() -> list[ReceivedSpan]:
        return [
            s for s in traced.otlp.spans()
            if s.name == "mmq.admit" and s.attributes.get("mmq.job_id") == job["id"]
        ]  # fmt: skip

    wait_until(lambda: bool(traced_job()), timeout_s=30)
    (admit,) = traced_job()
    assert admit.parent_id == ""  # a root: mmq's own trace
    run = traced.trace(admit.trace_id, {"mmq.run"})
    assert _one(run, "mmq.run").parent_id == admit.span_id


def test_a_worker_killed_mid_job_leaves_two_run_spans_attempts_1_and_2(
    traced: Traced, api: Api
) -> None:
    import redis

    dep = traced.dep
    worker = next(p for p in dep.procs if p.name.startswith("worker-sleep") and p.alive())
    trace_id, _, headers = _client_context()
    body = {"kind": "sleep", "input": {"steps": 40, "step_ms": 50}}
    r = api.http.post("/v1/jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    store = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    wait_until(lambda: job_id in running_on(store, worker), worker, timeout_s=30)
    # Its queue span has left the worker (spans of a killed process that had not, are lost).
    traced.trace(trace_id, {"mmq.queue"})
    worker.kill()
    dep.procs.remove(worker)
    dep.start_worker("sleep")
    assert api.wait(job_id, 60)["attempts"] == 2
    spans = traced.trace(trace_id, {"mmq.admit", "mmq.run"})
    wait_until(lambda: len(_runs(traced, trace_id)) == 2, timeout_s=30)
    first, second = _runs(traced, trace_id)
    admit = _one(spans, "mmq.admit")
    assert (first.attributes["mmq.attempt"], second.attributes["mmq.attempt"]) == (1, 2)
    assert first.parent_id == second.parent_id == admit.span_id
    assert first.failed and first.attributes["mmq.status"] == "lost"
    assert first.service == "mmq-reaper"  # its worker could not end it: the reaper did
    assert not second.failed and second.attributes["mmq.status"] == "succeeded"
    assert len([s for s in traced.otlp.spans() if s.trace_id == trace_id
                and s.name == "mmq.queue"]) == 2  # fmt: skip


def _runs(traced: Traced, trace_id: str) -> list[ReceivedSpan]:
    runs = [s for s in traced.otlp.spans() if s.trace_id == trace_id and s.name == "mmq.run"]
    return sorted(runs, key=lambda s: s.attributes["mmq.attempt"])
