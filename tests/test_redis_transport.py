"""mmq's kombu Redis transport against a real Redis: one client per channel, and the
acks-late bookkeeping (`unacked` while a message is held, gone after the ack) intact."""

from __future__ import annotations

import redis

from jobs.broker import make_celery
from jobs.redis_transport import Channel
from jobs.settings import load_settings


def test_a_channel_shares_one_client_and_acks_as_kombu_does(
    redis_url: str, rclient: redis.Redis
) -> None:
    app = make_celery(load_settings(redis_url=redis_url))
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        queue = "test.transport"
        with conn.Producer() as producer:
            producer.publish({"n": 1}, routing_key=queue, declare=[conn.SimpleQueue(queue).queue])
        held = rclient.hlen("unacked")
        message = channel.basic_get(queue, no_ack=False)
        assert message is not None and message.payload == {"n": 1}
        assert rclient.hlen("unacked") == held + 1  # a dead worker's message can come back
        message.ack()
        assert rclient.hlen("unacked") == held
    app.close()
