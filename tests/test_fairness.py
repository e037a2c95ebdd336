"""Fair share between keys against real processes (`fairness.enabled`, on by default): on
a busy pipeline, a key's one job goes before another key's burst, weights share the
slots, priorities keep their meaning, a held job canceled never runs, a newcomer's job
(its key has nothing at the workers) is released by its submit to the front of the
queue, within the same rules, and without a scheduler submits go straight to the
queue."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from broker.kombu_redis import PRIORITY_VALUES, job_id_of, priority_list
from broker.queues import queue_name
from harness.api_client import Api, limited_owner
from jobs import keys
from tuning.deployment import Deployment, flush, running, wait_until

STEP_MS = 100
"""One sleep job's time: the worker runs one at a time."""
ENV = {
    "MMQ_FAIRNESS__ENABLED": "true",
    "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.05",
    "MMQ_LEASE__HEARTBEAT_S": "0.3",
}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    with running(redis_url, tmp_path_factory.mktemp("fair"), ENV, ["sleep"]) as deployment:
        yield deployment


@pytest.fixture
def r(dep: Deployment) -> redis.Redis:
    return redis.Redis.from_url(dep.redis_url, decode_responses=True)


def _key(dep: Deployment, r: redis.Redis, weight: float | None = None) -> Api:
    return limited_owner(dep.redis_url, dep.base_url, weight=weight)


def _sleep(api: Api, priority: str = "normal", steps: int = 1) -> str:
    return api.submit("sleep", priority=priority, steps=steps, step_ms=STEP_MS)["id"]


def _started(api: Api, job_ids: list[str]) -> list[tuple[float, str]]:
    jobs = [api.wait(j, timeout_s=60) for j in job_ids]
    return [(_ts(j["started_at"]), j["id"]) for j in jobs]


def _ts(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _held(r: redis.Redis) -> int:
    """How many normal-priority sleep jobs the scheduler holds back now."""
    return int(r.hget(keys.HELD, "sleep|normal") or 0)


def _idle(r: redis.Redis) -> None:
    wait_until(
        lambda: r.zcard(keys.RUNNING) == 0 and not any(int(v) for v in r.hvals(keys.HELD)),
        timeout_s=60,
    )


def test_one_jobs_key_goes_before_another_keys_burst(dep: Deployment, r: redis.Redis) -> None:
    a, b = _key(dep, r), _key(dep, r)
    burst = [_sleep(a) for _ in range(20)]
    # A's burst is held behind the worker's one slot
    wait_until(lambda: _held(r) > 10, timeout_s=10)
    metrics = a.http.get("/metrics").text
    held = [ln for ln in metrics.splitlines() if ln.startswith('mmq_jobs_held{pipeline="sleep"')]
    assert held and float(held[0].split()[-1]) > 5
    mine = _sleep(b)
    job = b.wait(mine, timeout_s=30)
    assert job["status"] == "succeeded"
    still = [a.get(j)["status"] for j in burst]
    assert still.count("queued") > 5, still
    ran = [a.wait(j) for j in burst]
    assert {j["status"] for j in ran} == {"succeeded"}
    # behind the job running and those queued ahead when it came, not A's whole burst
    before = [j for j in ran if j["started_at"] < job["started_at"]]
    assert len(before) <= len(ran) - 10, len(before)
    _idle(r)


def test_weights_share_the_slots(dep: Deployment, r: redis.Redis) -> None:
    heavy, light = _key(dep, r, weight=3), _key(dep, r)
    blocker = _sleep(light, steps=5)  # holds the slot while both bursts are held
    ids = {}
    for _ in range(12):
        ids[_sleep(heavy)] = "heavy"
        ids[_sleep(light)] = "light"
    order = [
        ids[j]
        for _, j in sorted(
            _started(heavy, [j for j, w in ids.items() if w == "heavy"])
            + _started(light, [j for j, w in ids.items() if w == "light"])
        )
    ]
    first = order[:8]
    assert 5 <= first.count("heavy") <= 7, order  # 3 to 1 of the slot while both wait
    assert light.wait(blocker)["status"] == "succeeded"
    _idle(r)


def test_priorities_keep_their_meaning_and_a_canceled_held_job_never_runs(
    dep: Deployment, r: redis.Redis
) -> None:
    a, b = _key(dep, r), _key(dep, r)
    blocker = _sleep(b, steps=20)  # holds the slot until the burst and the urgent job wait
    burst = [_sleep(a) for _ in range(10)]
    wait_until(lambda: _held(r) >= 5, timeout_s=10)  # the burst waits behind the blocker
    canceled = burst[-1]
    a.http.post(f"/v1/jobs/{canceled}/cancel")
    urgent = _sleep(b, priority="high")
    high = b.wait(urgent, timeout_s=30)
    done = {j: a.wait(j) for j in burst}
    after = [j for j in burst[:-1] if done[j]["started_at"] > high["started_at"]]
    assert len(after) >= 5, after  # taken before the normal jobs still held when it came
    assert done[canceled]["status"] == "canceled" and done[canceled]["started_at"] is None
    assert all(done[j]["status"] == "succeeded" for j in burst[:-1])
    assert b.wait(blocker)["status"] == "succeeded"
    _idle(r)
    assert int(r.hget(keys.HELD, "sleep|normal") or 0) == 0


def _waiting(r: redis.Redis) -> list[str]:
    """The job ids of the normal-priority messages in the sleep queue, the next first."""
    raws = r.lrange(priority_list(queue_name("sleep"), PRIORITY_VALUES["normal"]), 0, -1)
    return [job_id_of(json.loads(raw)) or "" for raw in reversed(raws)]


@contextmanager
def _no_step(dep: Deployment, r: redis.Redis) -> Iterator[None]:
    """The scheduler paused (SIGSTOP) with the rooms it wrote last kept: no step runs."""
    (scheduler,) = [p for p in dep.procs if p.name == "scheduler"]
    scheduler.kill(signal.SIGSTOP)
    try:
        assert r.persist(keys.room("sleep"))
        yield
    finally:
        scheduler.kill(signal.SIGCONT)


def _busy(a: Api) -> str:
    """A job of `a` that holds the sleep worker's one slot for 2 s, once it runs."""
    blocker = _sleep(a, steps=20)
    wait_until(lambda: a.get(blocker)["status"] == "running", timeout_s=10)
    return blocker


def test_a_newcomers_job_is_released_by_its_submit_to_the_front_of_the_queue(
    dep: Deployment, r: redis.Redis
) -> None:
    """A key with nothing at the workers: its submit releases its job, with no scheduler
    step (it is paused), to the front of the queue, ahead of the other key's jobs released
    before and held; a second newcomer's goes behind the first's; a key with a job at the
    workers is held as before; once its job ended, a key is a newcomer again, even with
    no release made since."""
    a, b, c = _key(dep, r), _key(dep, r), _key(dep, r)
    blocker = _busy(a)
    burst = [_sleep(a) for _ in range(10)]
    wait_until(lambda: _held(r) >= 5, timeout_s=10)
    with _no_step(dep, r):
        held, ahead = _held(r), _waiting(r)
        assert ahead and set(ahead) < set(burst)  # A's, released to the queue before
        first, second = _sleep(b), _sleep(c)
        assert _waiting(r) == [first, second, *ahead]  # taken next, in the order they came
        assert r.hget(keys.job(first), "held") is None
        assert r.hget(keys.job(first), "released") == "1"
        again = _sleep(b)  # b has a job at the workers now: held for its turn
        assert r.hget(keys.job(again), "held") == "1"
        last = second
        for _ in range(3):  # once its job ended, a newcomer again, with no release since
            assert c.wait(last)["status"] == "succeeded"
            last = _sleep(c)
            assert r.hget(keys.job(last), "held") is None
        assert _held(r) == held + 1  # and nothing was released meanwhile
    done = {j: a.wait(j) for j in burst}
    one, two = b.wait(first), c.wait(second)
    assert {one["status"], two["status"], *(j["status"] for j in done.values())} == {"succeeded"}
    assert _ts(one["started_at"]) < _ts(two["started_at"])
    assert _ts(two["started_at"]) < min(_ts(j["started_at"]) for j in done.values())
    assert b.wait(again)["status"] == "succeeded"
    assert c.wait(last)["status"] == "succeeded"
    assert a.wait(blocker)["status"] == "succeeded"
    _idle(r)


def test_a_newcomer_waits_for_held_higher_priorities_its_weights_turn_and_a_worker(
    dep: Deployment, r: redis.Redis
) -> None:
    """A newcomer's job is held as any other while a job waits held at a higher priority,
    while its key's pass is past the lowest held one (weights 10 to 1: the light key's
    next job, submitted as soon as its first ended, waits its turn), and on a pipeline
    without a live worker (released once one comes)."""
    heavy, light = _key(dep, r, weight=10), _key(dep, r)
    blocker = _busy(heavy)
    urgent = [_sleep(heavy, priority="high") for _ in range(6)]
    wait_until(lambda: int(r.hget(keys.HELD, "sleep|high") or 0) >= 3, timeout_s=10)
    mine = _sleep(light)
    assert r.hget(keys.job(mine), "held") == "1"  # behind the held high jobs
    burst = [_sleep(heavy) for _ in range(30)]
    first = light.wait(mine, timeout_s=30)
    assert first["status"] == "succeeded"
    highs = [heavy.wait(j) for j in urgent]
    assert max(_ts(j["started_at"]) for j in highs) < _ts(first["started_at"])
    nxt = _sleep(light)  # nothing at the workers, but its share is spent
    assert r.hget(keys.job(nxt), "held") == "1"
    assert light.wait(nxt)["status"] == "succeeded"
    assert {heavy.wait(j)["status"] for j in [blocker, *burst]} == {"succeeded"}
    _idle(r)

    other = _key(dep, r)  # the echo pipeline has no worker in this deployment
    echo = other.submit("echo", text="hi")["id"]
    assert r.hget(keys.job(echo), "held") == "1"
    dep.start_worker("echo")
    assert other.wait(echo)["status"] == "succeeded"
    _idle(r)


def test_without_a_scheduler_submits_go_straight_to_the_queue(
    dep: Deployment, r: redis.Redis
) -> None:
    (scheduler,) = [p for p in dep.procs if p.name == "scheduler"]
    scheduler.stop()
    dep.procs.remove(scheduler)
    try:
        wait_until(lambda: not r.exists(keys.room("sleep")), timeout_s=10)
        a = _key(dep, r)
        ids = [_sleep(a) for _ in range(5)]
        assert {a.wait(j, timeout_s=30)["status"] for j in ids} == {"succeeded"}
    finally:
        dep.start_scheduler()
