"""The LLM token path as bytes: the engine's stream split without an object per line, a
job's text kept by its `Generation` and taken by the worker's event writer as one partial
event per job per write (encoded once), against real Redis and real threads."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from common.procs import free_port
from common.sse import DataSplitter
from jobs import keys
from jobs.models import EventType, WebhookSpec
from jobs.schemas.llm import LlmInput
from jobs.settings import Settings
from jobstore.store import JobStore, NewEvent
from pipelines.base import TakePartial, Touch
from pipelines.llm.engine_client import Delta, EngineClient, request_body
from pipelines.llm.generation import Generation, streams_text_alone
from tests.test_engine_http import Texts
from tests.test_event_writer import _stream
from workers.event_writer import EventWriter


@pytest.fixture
def store(redis_url: str) -> JobStore:
    return JobStore(
        redis.Redis.from_url(redis_url, decode_responses=True), Settings(redis_url=redis_url)
    )


def test_the_splitter_gives_each_events_data_wherever_the_bytes_are_cut() -> None:
    wire = (
        b'data: {"a":1}\n\n: keep-alive\n\n'
        b'data: {"b":"two\\nlines"}\r\n\r\n'
        b"event: x\nid: 7\ndata: first\ndata:second\n\n"
        b"data: [DONE]\n\n"
    )
    whole = DataSplitter().feed(wire)
    assert whole == [b'{"a":1}', b'{"b":"two\\nlines"}', b"first\nsecond", b"[DONE]"]
    for cut in range(1, len(wire)):  # every place a read can end, the CRLF's middle too
        splitter = DataSplitter()
        assert splitter.feed(wire[:cut]) + splitter.feed(wire[cut:]) == whole, cut
    bytewise = DataSplitter()
    assert [d for i in range(len(wire)) for d in bytewise.feed(wire[i : i + 1])] == whole


class _Request:
    """A `pipelines.base.Request` as the pipeline sees it, its events kept in order."""

    def __init__(self, inp: LlmInput, writer: EventWriter | None = None) -> None:
        self.job_id = f"job_t{time.monotonic_ns()}"
        self.input = inp
        self.writer = writer
        self.partials: list[dict[str, Any]] = []
        self.cancel = threading.Event()

    def drop_if_canceled(self) -> bool:
        return self.cancel.is_set()

    def partial(self, data: dict[str, Any]) -> None:
        self.partials.append(data)

    def stream(self, take: TakePartial) -> Touch:
        assert self.writer is not None
        return self.writer.stream(self.job_id, take, None)


def _chat(**fields: Any) -> LlmInput:
    return LlmInput.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_which_generations_stream_as_text_alone() -> None:
    assert streams_text_alone(_chat())
    assert streams_text_alone(LlmInput.model_validate({"prompt": "once"}))
    assert not streams_text_alone(_chat(n=2))
    assert not streams_text_alone(_chat(logprobs=True))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert not streams_text_alone(_chat(tools=[tool]))


def test_a_jobs_tokens_are_one_append_per_write_in_order_and_whole(store: JobStore) -> None:
    """Tokens kept while a write is in flight go in the next one, as one partial event:
    none lost, none twice, their deltas' indexes counted, the first output marked once."""
    writer = EventWriter(store)
    writer.start()
    try:
        request = _Request(_chat(), writer)
        generation = Generation(request)  # type: ignore[arg-type]  # the protocol's parts it uses
        tokens = [f't{i} é"\n ' for i in range(2_000)]
        for token in tokens:
            assert generation.text(token)
        assert writer.flush(timeout_s=10)
        events = _stream(store, request.job_id)
        assert {etype for etype, _ in events} == {"partial"}
        assert "".join(data["text"] for _, data in events) == "".join(tokens)
        assert len(events) < len(tokens)  # written together while a write was in flight
        indexes = [data["index"] for _, data in events]
        assert indexes[0] == 0 and indexes == sorted(indexes) and indexes[-1] < len(tokens)
        assert generation.take() is None  # nothing left
        assert "".join(generation.choices.choices[0].text) == "".join(tokens)
        assert request.partials == []  # nothing went as an event of its own
        first_output = store.r.hget(keys.job(request.job_id), "first_output_at")
        assert first_output is not None
    finally:
        writer.stop()


def test_tokens_from_another_thread_are_never_lost_between_take_and_touch(
    store: JobStore,
) -> None:
    """The writer takes a job's text while the engine's thread keeps adding to it."""
    writer = EventWriter(store)
    writer.start()
    try:
        requests = [_Request(_chat(), writer) for _ in range(4)]
        generations = [Generation(r) for r in requests]  # type: ignore[arg-type]

        def feed(generation: Generation) -> None:
            for i in range(1_500):
                generation.text(f"{i},")

        threads = [threading.Thread(target=feed, args=(g,)) for g in generations]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert writer.flush(timeout_s=20)
        expected = "".join(f"{i}," for i in range(1_500))
        for request in requests:
            events = _stream(store, request.job_id)
            assert "".join(data["text"] for _, data in events) == expected
    finally:
        writer.stop()


def test_other_deltas_go_as_events_of_their_own_and_a_cancel_stops_the_stream() -> None:
    request = _Request(_chat(n=2))
    generation = Generation(request)  # type: ignore[arg-type]
    assert generation.text("a")  # not text alone: a delta of its own
    assert generation.delta(Delta("b", choice=1))
    assert request.partials == [{"index": 0, "text": "a"}, {"index": 0, "text": "b", "choice": 1}]
    request.cancel.set()
    assert not generation.text("c")
    assert not generation.delta(Delta("d", choice=1))


def test_a_streamed_partial_reaches_a_webhook_as_json_and_is_fenced_by_its_lease(
    store: JobStore,
) -> None:
    job_id = f"job_h{time.monotonic_ns()}"
    handed: list[dict[str, Any]] = []
    fenced = JobStore(store.r, store.settings, on_event=lambda _j, _u, e: handed.append(e))
    webhook = WebhookSpec(url="https://example.com/hook", events=["partial"])
    store.r.set(keys.lease(job_id), "run", px=5000)
    data = b'{"index":0,"text":"hi"}'
    ids = fenced.append_events(
        [
            NewEvent(job_id, EventType.PARTIAL, data, True, webhook, lease_token="run"),
            NewEvent(job_id, EventType.PARTIAL, data, False, webhook, lease_token="old"),
        ]
    )
    assert ids[0] and ids[1] == ""
    assert _stream(store, job_id) == [("partial", {"index": 0, "text": "hi"})]
    assert [e["data"] for e in handed] == [{"index": 0, "text": "hi"}]


@pytest.fixture(scope="module")
def gathering_engine() -> Iterator[str]:
    """A synthetic engine that gathers 4 tokens per chunk, as vLLM's --stream-interval 4."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.synthetic_engine", "--port", str(port)]
    proc = subprocess.Popen([*argv, "--step-ms", "2", "--stream-interval", "4"])
    url = f"http://127.0.0.1:{port}"
    try:
        client = EngineClient(url, 5.0, 4)
        deadline = time.monotonic() + 60
        while True:  # until it answers
            try:
                client.stream(*request_body(_chat(max_tokens=1).record(), "synthetic"), Texts())
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_chunks_of_several_tokens_reach_the_jobs_stream_whole(
    gathering_engine: str, store: JobStore
) -> None:
    """An engine that sends a sequence's tokens 4 to a chunk (the first alone): the relay
    keeps each chunk as it came, and the job's partial events hold the answer whole."""
    writer = EventWriter(store)
    writer.start()
    client = EngineClient(gathering_engine, 5.0, 4)
    try:
        request = _Request(_chat(max_tokens=10), writer)
        generation = Generation(request)  # type: ignore[arg-type]
        finish = client.stream(*request_body(request.input.record(), "synthetic"), generation)
        assert finish is not None and finish.reasons == {0: "length"}
        assert generation.choices.choices[0].text == [" tok", " tok" * 4, " tok" * 4, " tok"]
        assert writer.flush(timeout_s=10)
        events = _stream(store, request.job_id)
        assert "".join(data["text"] for _, data in events) == " tok" * 10
    finally:
        client.close()
        writer.stop()
