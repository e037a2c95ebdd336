"""`broker/kombu_redis.py` against kombu itself and a real Redis: the pinned version, the
layout it names, the task message the submit and requeue scripts push (equal to the one
Celery sends), the unacked record, and the shared-client transport."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Queue
from kombu.transport import redis as kombu_redis_transport
from packaging.specifiers import SpecifierSet

from broker import kombu_redis
from broker.celery_app import job_message, make_celery
from broker.kombu_redis import (
    KOMBU_VERSIONS,
    UNACKED,
    UNACKED_INDEX,
    Envelope,
    Unacked,
    job_id_of,
    on_intake,
)
from broker.queues import TASK_NAME, queue_name
from jobs.models import Job
from jobs.settings import Priority, load_settings
from jobs.states import JobStatus


def _job(priority: Priority) -> Job:
    now = time.time()
    return Job(
        id=f"job_{priority}", kind="noop", pipeline="noop", status=JobStatus.QUEUED,
        owner="o", priority=priority, input={}, created_at=now, queued_at=now,
    )  # fmt: skip


def _shape(value: Any) -> Any:
    """Keys and value types, recursively: what must match between two messages whose
    ids and origins differ."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return type(value).__name__


def test_the_installed_kombu_is_the_pinned_one_and_pyproject_pins_it() -> None:
    assert version("kombu") in SpecifierSet(",".join(KOMBU_VERSIONS))
    pyproject = Path(kombu_redis.__file__).resolve().parents[1] / "pyproject.toml"
    with open(pyproject) as f:
        assert f'"kombu{",".join(KOMBU_VERSIONS)}"' in f.read()


def test_the_layout_is_kombus_own() -> None:
    channel = kombu_redis_transport.Channel
    assert (channel.unacked_key, channel.unacked_index_key) == (UNACKED, UNACKED_INDEX)
    assert channel.priority_steps == kombu_redis.PRIORITY_STEPS
    assert set(kombu_redis.PRIORITY_VALUES.values()) <= set(kombu_redis.PRIORITY_STEPS)


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_the_pushed_message_equals_the_one_celery_sends(
    redis_url: str, rclient: redis.Redis, priority: Priority
) -> None:
    app = make_celery(load_settings(None, redis_url=redis_url))
    job = _job(priority)
    before = set(rclient.keys("mmq.noop*"))
    app.send_task(
        TASK_NAME, args=[job.id], queue=queue_name(job.pipeline),
        priority=kombu_redis.PRIORITY_VALUES[priority],
    )  # fmt: skip
    (sent_list,) = set(rclient.keys("mmq.noop*")) - before
    sent = json.loads(rclient.rpop(sent_list))
    ours = job_message(app, job)
    mine = json.loads(ours.envelope)
    assert ours.list_key == sent_list == kombu_redis.priority_lists("mmq.noop")[priority]
    assert _shape(mine) == _shape(sent)
    for field in ("lang", "task", "retries", "timelimit", "argsrepr", "ignore_result"):
        assert mine["headers"][field] == sent["headers"][field], field
    for field in ("delivery_mode", "delivery_info", "priority", "body_encoding"):
        assert mine["properties"][field] == sent["properties"][field], field
    assert base64.b64decode(mine["body"]) == base64.b64decode(sent["body"])
    assert mine["headers"]["id"] == mine["headers"]["root_id"] != sent["headers"]["id"]
    assert mine["properties"]["correlation_id"] == mine["headers"]["id"]
    assert job_id_of(mine) == job_id_of(sent) == job.id
    again = json.loads(job_message(app, job).envelope)  # built from the same template
    assert again["headers"]["id"] != mine["headers"]["id"]
    assert again["properties"]["delivery_tag"] != mine["properties"]["delivery_tag"]


def test_waiting_and_unacked_messages_are_found_by_job_id(
    redis_url: str, rclient: redis.Redis
) -> None:
    rclient.flushdb()
    app = make_celery(load_settings(None, redis_url=redis_url))
    for priority in ("high", "low"):
        rclient.lpush(*job_message(app, _job(priority)))
    app.send_task("mmq.other_task", args=["job_not_a_run"], queue="mmq.noop")
    assert kombu_redis.queued_job_ids(rclient, "mmq.noop") == {"job_high", "job_low"}
    with app.connection_for_read() as conn:  # closing it would put the message back
        assert conn.default_channel.basic_get("mmq.noop", no_ack=False) is not None
        unacked = Unacked(app)
        assert unacked.job_ids() == {"job_high"}  # the highest priority is served first
        [(tag, job_id, _)] = unacked.older_than(time.time() + 1, 10)
        assert job_id == "job_high" and unacked.older_than(time.time() - 60, 10) == []
        unacked.restore(tag)
        assert unacked.job_ids() == set()
        assert kombu_redis.queued_job_ids(rclient, "mmq.noop") == {"job_high", "job_low"}
    app.close()


def test_a_channel_shares_one_client_and_acks_as_kombu_does(
    redis_url: str, rclient: redis.Redis
) -> None:
    app = make_celery(load_settings(redis_url=redis_url))
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, kombu_redis.Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        queue = "test.transport"
        with conn.Producer() as producer:
            producer.publish({"n": 1}, routing_key=queue, declare=[conn.SimpleQueue(queue).queue])
        held = rclient.hlen(UNACKED)
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None and message.payload == {"n": 1}
        assert rclient.hlen(UNACKED) == held + 1  # a dead worker's message can come back
        message.ack()
        assert rclient.hlen(UNACKED) == held
    app.close()


def test_a_closed_channel_acks_through_its_client_and_never_raises_attribute_error(
    redis_url: str, rclient: redis.Redis
) -> None:
    """After a lost connection, Celery's first close (`collect`) detaches the transport
    from the connection; a task that was running then acks later, through the channel it
    came from. kombu 5.7's own channel raises AttributeError there (it rebuilds its pool
    from the detached connection), and the worker stops."""
    app = make_celery(load_settings(redis_url=redis_url))
    conn = app.connection_for_write()
    channel, unused = conn.default_channel, conn.channel()
    queue = "test.closed"
    with conn.Producer() as producer:
        producer.publish({"n": 2}, routing_key=queue, declare=[conn.SimpleQueue(queue).queue])
    message = channel.basic_get(queue, no_ack=False)
    assert message is not None
    conn.collect()
    assert channel.connection is None or channel.connection.client is None
    message.ack()
    assert message.delivery_tag not in rclient.hkeys(UNACKED)
    with pytest.raises(redis.ConnectionError), unused.conn_or_acquire():
        pass  # a closed channel that never had a client
    app.close()


def _consume(
    conn: Any, rclient: redis.Redis, queue: str, sent: int, reads: int
) -> tuple[list[Any], dict[str, Any]]:
    """Publish `sent` messages ({"n": i}) to `queue`, then let a consumer of `conn` read
    `reads` times: the messages it got, and Redis's command stats of those reads."""
    with conn.Producer() as producer:
        for n in range(sent):
            producer.publish({"n": n}, routing_key=queue, declare=[Queue(queue)])
    rclient.config_resetstat()
    got: list[Any] = []
    with conn.Consumer([Queue(queue)], callbacks=[lambda _body, m: got.append(m)]):
        for _ in range(reads):
            conn.drain_events(timeout=2)
    return got, rclient.info("commandstats")


def test_a_consumer_takes_queued_messages_in_one_read_each_recorded_as_kombu_does(
    redis_url: str, rclient: redis.Redis
) -> None:
    """On Redis 7+ one BLMPOP takes every waiting message (up to `INTAKE_MAX`), in queue
    order; each is in `unacked` with the record kombu's own `append` writes (the reaper
    puts it back from there), and its ack removes it."""
    rclient.flushdb()
    app = make_celery(load_settings(redis_url=redis_url))
    queue = "test.intake"
    with app.connection_for_write() as conn:
        intakes: list[tuple[str, int, bool]] = []

        def hook(source: str, messages: Sequence[Envelope]) -> None:
            recorded = all(
                m["properties"]["delivery_tag"] in rclient.hkeys(UNACKED) for m in messages
            )
            intakes.append((source, len(messages), recorded))

        on_intake(hook)
        try:
            got, stats = _consume(conn, rclient, queue, sent=5, reads=1)
        finally:
            on_intake(None)
        assert [m.payload for m in got] == [{"n": n} for n in range(5)]
        assert stats["cmdstat_blmpop"]["calls"] == 1 and "cmdstat_brpop" not in stats
        # The intake's messages went to the hook together, recorded in `unacked` first.
        assert intakes == [(queue, 5, True)]
        records = rclient.hgetall(UNACKED)
        assert {m.delivery_tag for m in got} == set(records)
        # kombu's own path (one message, `basic_get`) writes the same record.
        producer_conn = conn.clone()
        with producer_conn, producer_conn.Producer() as producer:
            producer.publish({"n": 5}, routing_key=queue, declare=[Queue(queue)])
        own = conn.default_channel.basic_get(queue, no_ack=False)
        assert own is not None
        [batched, kombus] = [
            json.loads(str(rclient.hget(UNACKED, tag)))
            for tag in (got[0].delivery_tag, own.delivery_tag)
        ]
        assert _shape(batched) == _shape(kombus) and batched[1:] == kombus[1:]
        assert batched[0] == got[0]._raw
        for message in [*got, own]:
            message.ack()
        assert rclient.hlen(UNACKED) == 0 and rclient.zcard(UNACKED_INDEX) == 0
    app.close()


def test_with_a_key_prefix_the_consumer_keeps_kombus_brpop(
    redis_url: str, rclient: redis.Redis
) -> None:
    """BLMPOP's keys would miss kombu's prefixing: with `global_keyprefix` (or a server
    older than Redis 7) the channel reads one message per BRPOP, as kombu does."""
    rclient.flushdb()
    app = make_celery(load_settings(redis_url=redis_url))
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "global_keyprefix": "pfx:",
    }
    with app.connection_for_write() as conn:
        got, stats = _consume(conn, rclient, "test.prefixed", sent=2, reads=2)
        assert [m.payload for m in got] == [{"n": 0}, {"n": 1}]
        assert stats["cmdstat_brpop"]["calls"] == 2 and "cmdstat_blmpop" not in stats
        assert rclient.hlen(f"pfx:{UNACKED}") == 2
        for message in got:
            message.ack()
        assert rclient.hlen(f"pfx:{UNACKED}") == 0
    app.close()
