"""An LLM token on its way to the client as bytes: the worker writes its text as the JSON
string the client will read, the events channel carries it on a line of its own, and the
API's streams splice it into their frames without decoding it, yet a rerun's replay still
sends only what goes beyond what was sent."""

from __future__ import annotations

import time

import orjson
import pytest
import redis

from api.openai.completion_stream import ChatChunks, CompletionEvents
from api.openai.response_stream import ResponseEvents
from jobs import keys
from jobs.delivery import MEASURE_EVERY, Delivered
from jobs.models import Event, EventType, Job
from jobs.settings import Settings
from jobstore import notices
from jobstore.responses import ResponseRecord
from jobstore.store import JobStore
from pipelines.llm.generation import Generation
from tests.test_token_path import _chat, _Request
from workers.event_writer import EventWriter

TOKENS = ["Hi", ' "there"', " é\n", "\\", " 🙂", " x y  z", "\t."]
"""Text a JSON string must escape, spaces (the line's separator) and newlines (the
message's) among them."""


@pytest.fixture
def store(redis_url: str) -> JobStore:
    settings = Settings(redis_url=redis_url, job_ttl_s=60)
    return JobStore(redis.Redis.from_url(redis_url, decode_responses=True), settings)


def test_a_tokens_line_on_the_events_channel_carries_its_text_as_the_worker_wrote_it(
    store: JobStore,
) -> None:
    pubsub = store.r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.EVENTS_CHANNEL)
    pubsub.get_message(timeout=1)
    writer = EventWriter(store)
    writer.start()
    try:
        request = _Request(_chat(), writer)
        generation = Generation(request)  # type: ignore[arg-type]  # the protocol's parts it uses
        for token in TOKENS * 50:
            assert generation.text(token)
        assert writer.flush(timeout_s=10)
        heard: list[Event] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
            if message is None:
                if heard:
                    break
                continue
            heard += [notices.event_of(line) for line in notices.event_lines(message["data"])]
    finally:
        writer.stop()
        pubsub.close()
    ours = [e for e in heard if e.job_id == request.job_id]
    assert ours and all(e.type is EventType.PARTIAL and e.text_at for e in ours)
    literals = [e.text_literal for e in ours]
    assert [orjson.loads(lit) for lit in literals] == [e.data["text"] for e in ours]
    assert "".join(e.data["text"] for e in ours) == "".join(TOKENS * 50)
    stored = store.events(request.job_id)
    assert [e.id for e in stored] == [e.id for e in ours]  # the stream's entries, in order
    assert [e.data for e in stored] == [e.data for e in ours]


def _job() -> Job:
    now = time.time()
    return Job(
        id=f"job_f{time.monotonic_ns()}",
        kind="llm",
        pipeline="llm",
        status="running",
        owner="o",
        priority="normal",
        input={},
        created_at=now,
        queued_at=now,
    )


def _token(n: int, text: str, *, as_written: bool) -> Event:
    """A token's partial event as the hub makes it from its line (`as_written`), or as
    one read back from the job's stream (its data decoded, no `text_at`)."""
    head = b'{"index":%d,"text":' % n
    raw = head + orjson.dumps(text) + b"}"
    text_at = len(head) if as_written else 0
    return Event(id=f"1-{n}", job_id="j", type="partial", ts=1.0, raw=raw, text_at=text_at)


def _queued_again() -> Event:
    return Event(id="2-0", job_id="j", type="status", ts=2.0, data={"status": "queued"})


def _frames(events: CompletionEvents | ResponseEvents, stream: list[Event]) -> list[bytes]:
    return [frame for event in stream for frame in events(event)]


def _attempts(as_written: bool) -> list[Event]:
    """A job whose worker died after two tokens, and whose rerun sampled other words."""
    first = [_token(i, text, as_written=as_written) for i, text in enumerate(TOKENS[:3])]
    again = [_token(0, "".join(TOKENS[:2]) + " é\nbut", as_written=as_written)]
    again += [_token(1, text, as_written=as_written) for text in TOKENS[3:]]
    return [*first, _queued_again(), *again]


@pytest.mark.parametrize("route", ["chat", "responses"])
def test_a_stream_frames_a_written_token_as_it_frames_a_decoded_one(route: str) -> None:
    """The frames of a job's tokens relayed as written (a literal spliced in) and as read
    back from its stream (decoded, then encoded) are the same bytes, across a rerun:
    what the first attempt sent is not sent again."""
    job = _job()

    def stream() -> CompletionEvents | ResponseEvents:
        if route == "chat":
            return CompletionEvents(ChatChunks(job, "m"), False, {})
        record: ResponseRecord = {
            "owner": "o",
            "request": {"model": "m"},
            "input_items": [],
            "history": [],
            "created_at": job.created_at,
        }
        return ResponseEvents(job, record)

    written = _frames(stream(), _attempts(as_written=True))
    decoded = _frames(stream(), _attempts(as_written=False))
    assert written == decoded
    assert len(written) > len(TOKENS)


def test_a_literal_goes_on_whole_while_in_step_and_only_its_new_part_on_a_rerun() -> None:
    sent = Delivered()
    pieces = [f'{i} é"\n' for i in range(MEASURE_EVERY + 10)]  # measured once on the way
    for piece in pieces:
        literal = orjson.dumps(piece)
        assert sent.take_literal("text:0", literal) is literal  # relayed as it came
    sent.new_attempt()
    whole = "".join(pieces)
    assert sent.take_literal("text:0", orjson.dumps(whole[:7])) == b""
    assert sent.take_literal("text:0", orjson.dumps(whole[7:] + "more")) == b'"more"'
    assert sent.take("text:0", "!") == "!"
    assert sent.rest("text:0", whole + "more!?") == "?"
