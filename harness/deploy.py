"""Real deployments for tests: API under uvicorn, Celery workers, the reaper, as processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from common.procs import die_with_parent, free_port
from host.launcher import mmq_command
from jobs import keys

REPO = Path(__file__).resolve().parents[1]

TEST_CONFIG = """
[kinds.echo]
schema = "harness.pipelines:EchoInput"

[kinds.sleep]
schema = "harness.pipelines:SleepInput"

[pipelines.echo]
kind = "echo"
impl = "harness.pipelines:EchoPipeline"
max_batch = {echo_max_batch}
max_wait_ms = {echo_max_wait_ms}
concurrency = {echo_concurrency}

[pipelines.sleep]
kind = "sleep"
impl = "harness.pipelines:SleepPipeline"
max_batch = 1
concurrency = 1
"""


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self.alive():
            return
        self.kill(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Deployment:
    """Processes of one test deployment, all sharing one Redis and one config file."""

    redis_url: str
    tmp: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    config_values: dict[str, Any] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0

    def __post_init__(self) -> None:
        values = {"echo_max_batch": 8, "echo_max_wait_ms": 50, "echo_concurrency": 8}
        values.update(self.config_values)
        self.config_path = self.tmp / "mmq.toml"
        self.config_path.write_text(TEST_CONFIG.format(**values))
        self.api_port = free_port()

    @property
    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "MMQ_REDIS_URL": self.redis_url,
            "MMQ_CONFIG_FILE": str(self.config_path),
            "MMQ_DATA_DIR": str(self.tmp / "data"),
            "MMQ_API__PORT": str(self.api_port),
            "MMQ_AUTH__REQUIRED": "true",
            "MMQ_LOG_LEVEL": "INFO",
            # The release stage (fair share, batches, on-demand turns) steps faster than
            # the default 0.2 s: a test's burst is not held a step longer than it needs.
            "MMQ_BATCHES__RELEASE_INTERVAL_S": "0.05",
        }
        env.update(self.env_overrides)
        return env

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def spawn(
        self,
        name: str,
        *args: str,
        wrap: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """`mmq ARGS` as a process of this deployment (see `launch`)."""
        return self.launch(name, mmq_command(*args), wrap=wrap, env=env)

    def launch(
        self,
        name: str,
        argv: Sequence[str],
        *,
        wrap: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> Proc:
        """`argv` in its own process group, logging to a file; `wrap` goes before it (`ip
        netns exec NAME`: a test host), `env` over the deployment's environment."""
        log_path = self.tmp / f"{name.replace(' ', '_')}.log"
        log_file = log_path.open("ab")
        process = subprocess.Popen(
            [*wrap, *argv],
            env={**self.env, **(env or {})},
            cwd=REPO,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        proc = Proc(name, process, log_path)
        self.procs.append(proc)
        return proc

    def start_api(self) -> Proc:
        proc = self.spawn("api", "api")
        wait_until(lambda: _healthy(self.base_url), proc, timeout_s=30)
        return proc

    def start_worker(
        self, pipeline: str, instance: int = 0, env: dict[str, str] | None = None
    ) -> Proc:
        proc = self.spawn(
            f"worker-{pipeline}-{instance}-{len(self.procs)}",
            "worker",
            "--pipeline",
            pipeline,
            "--instance",
            str(instance),
            env=env,
        )
        wait_until(lambda: "ready." in proc.log(), proc, timeout_s=30)
        return proc

    def start_reaper(self) -> Proc:
        return self.spawn("reaper", "reaper")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-4000:]}" for p in self.procs)


@contextlib.contextmanager
def serving(dep: Deployment) -> Iterator[Deployment]:
    """Stop the deployment's processes at the end; print their logs if something failed."""
    try:
        yield dep
    except BaseException:
        print(dep.logs())
        raise
    finally:
        dep.stop()


@contextlib.contextmanager
def running(
    redis_url: str,
    tmp: Path,
    env: dict[str, str],
    workers: Sequence[str],
    config: str = "",
    config_values: dict[str, Any] | None = None,
) -> Iterator[Deployment]:
    """A deployment on `redis_url` with `config` added to the test config: the API, the
    reaper and `workers` (pipeline names) started and ready; everything stopped after."""
    dep = Deployment(redis_url, tmp, env, config_values or {})
    if config:
        dep.config_path.write_text(dep.config_path.read_text() + config)
    with serving(dep):
        dep.start_api()
        dep.start_reaper()
        for pipeline in workers:
            dep.start_worker(pipeline)
        yield dep


def _healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(check: Any, proc: Proc | None = None, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n{proc.log()}")
        time.sleep(0.05)
    detail = f":\n{proc.log()[-4000:]}" if proc is not None else ""
    raise TimeoutError(f"condition not met in {timeout_s}s{detail}")


def status_events(r: redis.Redis, job_id: str) -> list[str]:
    """The statuses of a job's status events, in order, from its stream."""
    entries = cast(list[tuple[str, dict[str, str]]], r.xrange(keys.job_events(job_id)))
    return [json.loads(e["data"])["status"] for _, e in entries if e["type"] == "status"]


def flush(redis_url: str) -> None:
    redis.Redis.from_url(redis_url).flushdb()


def answers(r: redis.Redis) -> bool:
    """Whether the Redis server behind `r` answers a PING now."""
    try:
        return bool(r.ping())
    except redis.RedisError:
        return False


def cmdline(pid: int) -> bytes:
    """A process's command line, NUL-separated (b"" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
