"""`MetricsTally` against a real Redis: counts add up in memory, one write per flush, and
a write that failed is kept whole for the next one."""

from __future__ import annotations

import redis

from jobs import keys
from jobstore.metric_counts import MetricsTally
from telemetry.metric_defs import BATCH_SIZE, JOBS_FINISHED, batch_samples, field_of


def test_counts_add_up_until_a_flush_writes_them(rclient: redis.Redis) -> None:
    tally = MetricsTally(rclient, interval_s=60)
    finished = keys.metric(JOBS_FINISHED.name)
    sizes = keys.metric(BATCH_SIZE.name)
    before = int(rclient.hget(finished, field_of(("tally", "succeeded"))) or 0)
    for size in (1, 3, 3):
        tally.add(batch_samples("tally-pipe", size, 0.01))
        tally.add([(JOBS_FINISHED, ("tally", "succeeded"), 1)])
    assert tally.pending()
    assert int(rclient.hget(finished, field_of(("tally", "succeeded"))) or 0) == before
    assert tally.flush()
    assert not tally.pending()
    assert int(rclient.hget(finished, field_of(("tally", "succeeded")))) == before + 3
    assert int(rclient.hget(sizes, field_of(("tally-pipe",), "4.0"))) == 2
    assert int(rclient.hget(sizes, field_of(("tally-pipe",), "1.0"))) == 1
    assert float(rclient.hget(sizes, field_of(("tally-pipe",), "sum"))) == 7.0


def test_a_failed_write_is_kept_for_the_next_flush(rclient: redis.Redis, redis_url: str) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    tally = MetricsTally(dead, interval_s=60)
    tally.add([(JOBS_FINISHED, ("tally-kept", "failed"), 1)] * 2)
    assert not tally.flush()
    assert tally.pending()
    tally.r = redis.Redis.from_url(redis_url)  # Redis is back
    tally.add([(JOBS_FINISHED, ("tally-kept", "failed"), 1)])
    assert tally.flush()
    finished = keys.metric(JOBS_FINISHED.name)
    assert int(rclient.hget(finished, field_of(("tally-kept", "failed")))) == 3


def test_stop_writes_what_is_left(rclient: redis.Redis) -> None:
    tally = MetricsTally(rclient, interval_s=60)
    tally.start()
    tally.add([(JOBS_FINISHED, ("tally-stop", "canceled"), 1)])
    tally.stop()
    finished = keys.metric(JOBS_FINISHED.name)
    assert int(rclient.hget(finished, field_of(("tally-stop", "canceled")))) == 1
