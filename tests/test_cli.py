"""The `mmq keys` commands against a real Redis, and a created key used on the API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import redis

from jobs import keys
from tests.support.deploy import REPO, Deployment, wait_until


def _mmq(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MMQ_REDIS_URL": redis_url, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "mmq.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_keys_create_prints_a_key_that_is_stored_only_as_a_hash(
    deployment: Deployment, rclient: redis.Redis
) -> None:
    created = _mmq("keys", "create", "carol", redis_url=deployment.redis_url)
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("mmq_")
    stored = rclient.hgetall(keys.API_KEYS)
    assert key not in stored and all(key not in v for v in stored.values())
    r = httpx.get(f"{deployment.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200

    revoked = _mmq("keys", "revoke", "carol", redis_url=deployment.redis_url)
    assert revoked.returncode == 0 and "revoked 1" in revoked.stdout
    r = httpx.get(f"{deployment.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 401

    bad = _mmq("keys", "create", "no spaces allowed", redis_url=deployment.redis_url)
    assert bad.returncode != 0


def test_keys_without_a_redis_url_or_a_running_up_say_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MMQ_")}
    env |= {"MMQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    made = subprocess.run(
        [sys.executable, "-m", "mmq.cli", "keys", "create", "dave"], env=env, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 2
    assert "no `mmq up` runs with data dir" in made.stderr and made.stdout == ""


def test_submit_follow_prints_events_and_exit_code_tells_the_end(
    deployment: Deployment, rclient: redis.Redis
) -> None:
    from jobs.apikeys import create_key

    key = create_key(rclient, "follower")
    env = {"url": deployment.base_url, "key": key}
    ok = _mmq(
        "submit", "sleep", "--set", "steps=3", "--set", "step_ms=50", "--follow",
        "--url", env["url"], "--key", env["key"], redis_url=deployment.redis_url,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "status running" in ok.stdout and "status succeeded" in ok.stdout
    assert '"steps": 3' in ok.stdout

    failed = _mmq(
        "submit", "echo", "-i", '{"text": "x", "fail": true, "group": "cli"}', "--follow",
        "--url", env["url"], "--key", env["key"], redis_url=deployment.redis_url,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "status failed" in failed.stdout and "boom" in failed.stdout

    bad = _mmq(
        "submit", "echo", "--set", "colour=red", "--url", env["url"], "--key", env["key"],
        redis_url=deployment.redis_url,
    )  # fmt: skip
    assert bad.returncode == 2 and "422 invalid_input: input." in bad.stdout


def test_a_joining_host_refuses_unshared_local_storage(redis_url: str) -> None:
    """`mmq workers` on another host: outputs it writes must be readable by the API."""
    done = _mmq("workers", "--redis", redis_url, redis_url="")
    assert done.returncode == 2
    assert "storage.local_shared" in done.stderr and '"s3"' in done.stderr, done.stderr


def test_a_worker_joins_with_redis_and_host_name_options(deployment: Deployment) -> None:
    """`--redis` and `--host-name` on the command line: the worker's id and its liveness
    record carry the host name (namespaced or containerised hosts share system names)."""
    r = redis.Redis.from_url(deployment.redis_url, decode_responses=True)
    worker = deployment.spawn(
        "worker-box7", "worker", "--pipeline", "echo", "--redis", deployment.redis_url,
        "--host-name", "box-7", env={"MMQ_REDIS_URL": ""},
    )  # fmt: skip
    try:

        def registered() -> list[str]:
            return [n for n in r.zrange(keys.WORKERS, 0, -1) if "@box-7." in n]

        wait_until(lambda: bool(registered()), worker, timeout_s=30)
        (name,) = registered()
        assert name.startswith("echo-0@box-7.")
        assert r.hget(keys.worker(name), "host") == "box-7"
    finally:
        worker.stop()
