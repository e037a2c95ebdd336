"""OpenAI's Batch API driven by the official `openai` client against a real deployment (API,
reaper, scheduler, echo and sleep workers): every line ends in exactly one of the two
files, also when a worker, the scheduler, the API or Redis dies mid-batch;
bad lines are named by number and field without failing the batch; lines wait behind
interactive jobs and never count against the 429 bound; cancel and the completion window
end a batch with what finished written out."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from harness.api_client import new_owner
from harness.batch_files import job_line, jsonl
from host.redis_server import RedisServer
from jobs import keys
from jobstore.api_keys import create_key
from scheduler.slots import Slots
from tuning.deployment import (
    Deployment,
    Proc,
    flush,
    running,
    running_on,
    serving,
    status_events,
    wait_until,
)

ENV = {
    "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.1",
    "MMQ_LEASE__REAPER_INTERVAL_S": "0.2",
    "MMQ_LEASE__HEARTBEAT_S": "0.3",
    "MMQ_LEASE__TTL_S": "2",
    "MMQ_QUEUE__MAX_QUEUED": "3",
}


@pytest.fixture(scope="module")
def dep(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flush(redis_url)
    tmp = tmp_path_factory.mktemp("batches")
    with running(redis_url, tmp, ENV, ["echo", "sleep"]) as deployment:
        yield deployment


def _client(dep: Deployment) -> openai.OpenAI:
    key = new_owner(dep.redis_url, dep.base_url, f"batch{time.monotonic_ns()}").key
    return openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=key, max_retries=0)


def _run(client: openai.OpenAI, lines: list[Any], window: str = "24h", **extra: Any) -> Any:
    source = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/jobs",  # type: ignore[arg-type]  # mmq's own endpoint
        completion_window=window,  # type: ignore[arg-type]  # mmq takes shorter windows
        **extra,
    )


def _ended(client: openai.OpenAI, batch_id: str, timeout_s: float = 60) -> Any:
    ended = {"completed", "failed", "cancelled", "expired"}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ended:
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} did not end in {timeout_s}s")


def _completed_once_each(
    client: openai.OpenAI, batch_id: str, custom_ids: list[str], timeout_s: float = 60
) -> Any:
    """The batch once it has ended `completed`, with each line in the output file once."""
    batch = _ended(client, batch_id, timeout_s)
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == len(custom_ids) and batch.error_file_id is None
    output = _file(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(custom_ids)
    return batch


def _kill(dep: Deployment, proc: Proc) -> None:
    """SIGKILL one of the deployment's processes, mid-batch, and forget it."""
    proc.kill()
    dep.procs.remove(proc)


def _file(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_runs_every_line_once_and_names_bad_lines(dep: Deployment) -> None:
    client = _client(dep)
    lines: list[Any] = [job_line(f"ok-{i}", "echo", text=f"t{i}") for i in range(24)]
    lines.insert(2, b"{not json")
    lines.insert(5, {"method": "POST", "url": "/v1/jobs", "body": {"kind": "echo"}})
    lines.insert(7, job_line("wrong-url", "echo", text="x") | {"url": "/v1/embeddings"})
    lines.insert(9, job_line("too-long", "echo", text="x" * 1001))
    lines.insert(11, job_line("ok-0", "echo", text="again"))
    lines.append(job_line("rejected", "echo", text="r", reject=True))
    batch = _run(client, lines, metadata={"team": "search"})
    assert batch.status in {"in_progress", "completed"} and batch.metadata == {"team": "search"}
    assert batch.request_counts.total == len(lines)

    batch = _ended(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.completed == 24
    assert batch.request_counts.failed == 6
    output, errors = _file(client, batch.output_file_id), _file(client, batch.error_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"ok-{i}" for i in range(24))
    for line in output:
        response = line["response"]
        assert response["status_code"] == 200 and line["error"] is None
        assert response["body"]["status"] == "succeeded"
        assert response["body"]["output"]["text"] == "t" + line["custom_id"].removeprefix("ok-")
        assert response["body"]["priority"] == "batch"
        assert response["body"]["metadata"]["batch_id"] == batch.id
    by_message = {e["error"]["message"]: e for e in errors if e["error"]}
    assert any(m.startswith("line 3: line: is not JSON") for m in by_message)
    assert any(m.startswith("line 6: custom_id:") for m in by_message)
    assert any(m.startswith("line 8: url: must be the batch's endpoint") for m in by_message)
    assert any(m.startswith("line 10: body.input.text:") for m in by_message)
    assert any(m.startswith("line 12: custom_id: 'ok-0' is used") for m in by_message)
    (rejected,) = [e for e in errors if e["custom_id"] == "rejected"]
    assert rejected["response"]["status_code"] == 422
    assert rejected["response"]["body"]["status"] == "failed"
    assert len(output) + len(errors) == len(lines)

    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list()]
    # An admin's key sees every owner's batches (with their owner), or one owner's; another
    # key sees only its own, and may not ask for another's.
    owner = str(client.api_key)
    r = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    admin = openai.OpenAI(base_url=f"{dep.base_url}/v1", api_key=create_key(r, "ops", admin=True))
    listed = {b.id: b for b in admin.batches.list()}
    whose = _whoami(dep, owner)
    assert batch.id in listed and listed[batch.id].model_extra == {"owner": whose}
    assert batch.id in [b.id for b in admin.batches.list(extra_query={"owner": whose})]
    assert [b.id for b in admin.batches.list(extra_query={"owner": "nobody"})] == []
    assert admin.batches.retrieve(batch.id).id == batch.id
    other = _client(dep)
    assert batch.id not in [b.id for b in other.batches.list()]
    with pytest.raises(openai.PermissionDeniedError):
        other.batches.list(extra_query={"owner": whose})
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)


def _whoami(dep: Deployment, key: str) -> str:
    me = httpx.get(f"{dep.base_url}/v1/whoami", headers={"Authorization": f"Bearer {key}"})
    return str(me.json()["owner"])


def test_lines_wait_behind_interactive_jobs_and_never_count_against_429(
    dep: Deployment, rclient: redis.Redis
) -> None:
    """The sleep worker runs one job at a time; 3 jobs may queue (MMQ_QUEUE__MAX_QUEUED)."""
    client = _client(dep)
    lines = [job_line(f"s{i}", "sleep", steps=1, step_ms=300) for i in range(10)]
    batch = _run(client, lines)
    wait_until(lambda: rclient.hlen(keys.batch_inflight(batch.id)) > 0, timeout_s=10)
    held = []
    http = client._client  # the same key, for mmq's own route
    auth = {"Authorization": f"Bearer {client.api_key}"}
    url = f"{dep.base_url}/v1/jobs"
    body = {"kind": "sleep", "input": {"steps": 1, "step_ms": 10}}
    interactive = []
    for _ in range(3):  # the bound is 3: the waiting batch lines do not count
        r = http.post(url, json=body, headers=auth)
        assert r.status_code == 202, r.text
        interactive.append(r.json()["id"])
        held.append(rclient.hlen(keys.batch_inflight(batch.id)))
    metrics = http.get(f"{dep.base_url}/metrics").text
    assert 'mmq_batches_active{status="in_progress"} 1.0' in metrics
    waiting = [
        ln for ln in metrics.splitlines() if ln.startswith('mmq_batch_lines{state="waiting"}')
    ]
    assert waiting and float(waiting[0].split()[-1]) > 0
    started = []
    for job_id in interactive:
        job = http.get(f"{url}/{job_id}", headers=auth | {"Prefer": "wait=10"}).json()
        assert job["status"] == "succeeded"
        started.append(job["started_at"])
    # shallow: the line running in the worker's one slot, and one queued ahead of it
    assert max(held) <= 2
    assert rclient.scard(keys.queued("sleep")) == 0
    batch = _ended(client, batch.id)
    assert batch.request_counts.completed == 10
    # taken before the lines still waiting when they came, not after the whole batch
    last_line = http.get(f"{url}/job_{batch.id.removeprefix('batch_')}_10", headers=auth).json()
    assert max(started) < last_line["started_at"]


def test_every_line_ends_once_when_the_scheduler_is_killed(dep: Deployment) -> None:
    client = _client(dep)
    lines = [job_line(f"k{i}", "echo", text=f"k{i}", sleep_ms=40) for i in range(80)]
    batch = _run(client, lines)
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 8)
    (scheduler,) = [p for p in dep.procs if p.name == "scheduler"]
    _kill(dep, scheduler)  # mid-release and mid-collect
    dep.start_scheduler()
    _completed_once_each(client, batch.id, [f"k{i}" for i in range(80)])


def test_every_line_ends_once_when_a_worker_dies_and_the_api_restarts(dep: Deployment) -> None:
    """A worker SIGKILLed while it runs lines, and the API killed and started again: the
    lines that worker held run again on the other one, and every line ends once."""
    client = _client(dep)
    r = redis.Redis.from_url(dep.redis_url, decode_responses=True)
    survivor = dep.start_worker("sleep")
    victim = next(p for p in dep.procs if p.name.startswith("worker-sleep") and p is not survivor)
    lines = [job_line(f"d{i}", "sleep", steps=3, step_ms=100) for i in range(16)]
    batch = _run(client, lines)
    prefix = f"job_{batch.id.removeprefix('batch_')}_"

    wait_until(lambda: bool(running_on(r, victim, prefix)), victim)
    _kill(dep, victim)
    # Still `running` under the dead worker: they end only through a rerun.
    lost = running_on(r, victim, prefix)
    assert lost
    (api,) = [p for p in dep.procs if p.name == "api"]
    _kill(dep, api)
    dep.start_api()

    _completed_once_each(client, batch.id, [f"d{i}" for i in range(16)])
    for line in range(1, 17):  # a line's job is named by its line number
        assert status_events(r, f"{prefix}{line}").count("succeeded") == 1
    for job_id in lost:
        output_of = json.loads(r.hget(keys.job(job_id), "output") or "{}")
        assert r.hget(keys.job(job_id), "attempts") == "2", job_id
        assert output_of["pid"] == survivor.process.pid
    assert survivor.alive()


def test_preemption_stops_the_newest_lines_for_what_waits_beyond_the_free_slots() -> None:
    slot = Slots(
        total=4, ahead=1, running=4, queued=[0, 2, 0], batch_queued=3, held=[0, 0, 1],
        lines_running=[(1.0, "a"), (3.0, "c"), (2.0, "b")], preempting=1,
    )  # fmt: skip
    assert slot.to_preempt() == ["c", "b"]  # 3 waiting, no slot free, 1 line already stopping
    slot.running = 3  # a slot is free: it takes one of them
    assert slot.to_preempt() == ["c"]
    slot.queued, slot.held = [0, 0, 0], [0, 0, 0]  # only batch lines wait
    assert slot.to_preempt() == []


def test_preempt_stops_the_line_holding_the_slot_for_an_interactive_job(tmp_path: Path) -> None:
    """`batches.preempt`: an interactive job that finds the only slot held by a long batch
    line stops that line at its next step and runs before it; the line goes back to the
    queue, runs again whole (the stopped run is not counted as an attempt), and the batch
    completes with every line once."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        (tmp_path / "deploy").mkdir()
        dep = Deployment(server.url, tmp_path / "deploy", ENV | {"MMQ_BATCHES__PREEMPT": "true"})
        with serving(dep):
            dep.start(["sleep"])  # one slot
            client = _client(dep)
            lines = [job_line(f"p{i}", "sleep", steps=20, step_ms=100) for i in range(2)]
            batch = _run(client, lines)
            r = redis.Redis.from_url(server.url, decode_responses=True)
            line = f"job_{batch.id.removeprefix('batch_')}_1"
            wait_until(lambda: r.hget(keys.job(line), "status") == "running")
            owner = new_owner(server.url, dep.base_url, "interactive")
            job = owner.wait(owner.submit("sleep", steps=1, step_ms=10)["id"])
            assert job["status"] == "succeeded"

            _completed_once_each(client, batch.id, ["p0", "p1"])
            line_job = r.hgetall(keys.job(line))
            assert json.loads(line_job["output"])["steps"] == 20 and line_job["attempts"] == "1"
            # The interactive job ended before the line it stopped started again.
            ended_at = float(r.hget(keys.job(job["id"]), "finished_at") or "inf")
            assert ended_at < float(line_job["started_at"])
            assert status_events(r, line) == [
                "queued", "running", "queued", "running", "succeeded"
            ]  # fmt: skip
            requeued = [
                json.loads(e["data"])
                for _, e in r.xrange(keys.job_events(line))
                if e["type"] == "status" and json.loads(e["data"])["status"] == "queued"
            ]
            assert requeued[-1].get("reason") == "preempted"
            counted = 'mmq_batch_lines_preempted_total{pipeline="sleep"} 1.0'
            wait_until(lambda: counted in owner.http.get("/metrics").text)
    finally:
        server.stop()


def test_cancel_lets_running_lines_end_and_writes_what_finished(dep: Deployment) -> None:
    client = _client(dep)
    lines = [job_line(f"c{i}", "sleep", steps=3, step_ms=100) for i in range(12)]
    batch = _run(client, lines)
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"}
    batch = _ended(client, batch.id)
    assert batch.status == "cancelled"
    output, errors = _file(client, batch.output_file_id), _file(client, batch.error_file_id)
    assert output and errors
    assert sorted(x["custom_id"] for x in output + errors) == sorted(f"c{i}" for i in range(12))
    assert {e["error"]["code"] for e in errors if e["error"]} == {"batch_cancelled"}
    assert batch.request_counts.completed == len(output)
    assert batch.request_counts.failed == len(errors)


def test_a_batch_past_its_window_expires_with_what_finished(dep: Deployment) -> None:
    client = _client(dep)
    lines = [job_line(f"w{i}", "sleep", steps=4, step_ms=100) for i in range(20)]
    batch = _ended(client, _run(client, lines, window="2s").id)
    assert batch.status == "expired"
    output, errors = _file(client, batch.output_file_id), _file(client, batch.error_file_id)
    assert 1 <= len(output) < 20
    assert sorted(x["custom_id"] for x in output + errors) == sorted(f"w{i}" for i in range(20))
    assert batch.expired_at is not None and batch.expired_at - batch.created_at < 10


def test_batches_refuse_what_they_cannot_run(dep: Deployment) -> None:
    client = _client(dep)
    other = _client(dep)
    source = client.files.create(file=("r.jsonl", b"\n"), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError, match="endpoint"):
        client.batches.create(
            input_file_id=source.id,
            endpoint="/v1/images/generations",  # type: ignore[arg-type]
            completion_window="24h",
        )
    with pytest.raises(openai.NotFoundError):
        other.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    empty = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert empty.status == "failed" and empty.errors is not None
    assert empty.errors.data is not None and empty.errors.data[0].code == "empty_file"
    user_file = client.files.create(file=("u.txt", b"x"), purpose="user_data")
    with pytest.raises(openai.UnprocessableEntityError, match="purpose"):
        client.batches.create(
            input_file_id=user_file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert client.files.content(user_file.id).read() == b"x"
    assert client.files.delete(user_file.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(user_file.id)


def test_a_chat_batch_answers_in_openais_shape(kinds_dep: Deployment) -> None:
    client = _client(kinds_dep)
    lines = [
        {
            "custom_id": f"chat-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "llm",
                "messages": [{"role": "user", "content": f"Count to {i}."}],
                "max_tokens": 4,
                "temperature": 0,
            },
        }
        for i in range(3)
    ]
    source = client.files.create(file=("chat.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = _ended(client, batch.id, timeout_s=120)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    for line in _file(client, batch.output_file_id):
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "llm"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] > 0


def test_a_batch_keeps_every_line_across_a_redis_crash(tmp_path: Path) -> None:
    """`redis.durability = fsync`: SIGKILL Redis mid-batch and start it again on its data
    dir; the batch completes with every line in the output file once."""
    server = RedisServer(tmp_path / "redis", fsync_always=True).start()
    try:
        env = ENV | {"MMQ_REDIS__DURABILITY": "fsync", "MMQ_LEASE__TTL_S": "3"}
        (tmp_path / "deploy").mkdir()
        dep = Deployment(server.url, tmp_path / "deploy", env)
        with serving(dep):
            dep.start(["echo"])  # the API, reaper, scheduler and worker, at once
            client = _client(dep)
            lines = [job_line(f"r{i}", "echo", text=f"r{i}", sleep_ms=100) for i in range(60)]
            batch = _run(client, lines)
            wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 6)
            assert client.batches.retrieve(batch.id).request_counts.completed < 60  # mid-batch
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
            time.sleep(0.5)
            server.start()
            _completed_once_each(client, batch.id, [f"r{i}" for i in range(60)], timeout_s=90)
    finally:
        server.stop()
