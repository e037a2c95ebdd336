"""The one deployment builder of tests, benches and `mmq tune`: the API under uvicorn,
Celery workers and the reaper as processes (each in its own process group, logging to a
file) on one Redis and one config file, on free ports, stopped as a group.

`Deployment` on a Redis the caller runs (the tests' session server); `private_deployment`
with a Redis of its own in a temporary directory (benches, tunes). The config is the tests'
(`echo` and `sleep` pipelines) plus what a caller adds, or the caller's alone
(`test_pipelines=False`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import httpx
import redis

from common.procs import die_with_parent, free_port
from host.launcher import mmq_command
from host.redis_server import RedisServer
from jobstore.job_lookup import JobLookup

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


START_TIMEOUT_S = 120.0
"""How long a deployment's processes, started at once, may take to be ready: on two busy
cores a dozen interpreters importing at once take a minute (a bound, not a pace)."""


class ConfigValues(TypedDict, total=False):
    """The knobs of the tests' echo pipeline (`TEST_CONFIG`)."""

    echo_max_batch: int
    echo_max_wait_ms: int
    echo_concurrency: int


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
        stop_all([self], timeout_s)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Deployment:
    """Processes of one test deployment, all sharing one Redis and one config file."""

    redis_url: str
    tmp: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    config_values: ConfigValues = field(default_factory=lambda: ConfigValues())
    procs: list[Proc] = field(default_factory=list)
    api_port: int = 0
    config: str = ""
    """Added to the tests' config, or the whole config with `test_pipelines=False`."""
    test_pipelines: bool = True
    test_env: bool = True
    """False: the processes run where and as this one does (`mmq tune`: in the user's
    working directory and environment, less its MMQ_ settings), with the deployment's
    Redis, config file, data dir and API port alone."""

    def __post_init__(self) -> None:
        values = ConfigValues(echo_max_batch=8, echo_max_wait_ms=50, echo_concurrency=8)
        values.update(self.config_values)
        base = TEST_CONFIG.format(**values) if self.test_pipelines else ""
        self.config_path = self.tmp / "mmq.toml"
        self.config_path.write_text(base + self.config)
        self.api_port = free_port()
        self.instances: dict[str, int] = {}

    @property
    def env(self) -> dict[str, str]:
        own = {
            "MMQ_REDIS_URL": self.redis_url,
            "MMQ_CONFIG_FILE": str(self.config_path),
            "MMQ_DATA_DIR": str(self.tmp / "data"),
            "MMQ_API__PORT": str(self.api_port),
        }
        if not self.test_env:
            user = {k: v for k, v in os.environ.items() if not k.startswith("MMQ_")}
            return {**user, **own, **self.env_overrides}
        env = {
            **os.environ,
            # The repo first, then what the caller had (a GPU host's carried wheels).
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **own,
            "HF_HUB_OFFLINE": "1",
            "MMQ_AUTH__REQUIRED": "true",
            "MMQ_LOG_LEVEL": "INFO",
            # The scheduler (fair share, batches, on-demand turns) steps faster than
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
            cwd=REPO if self.test_env else None,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        proc = Proc(name, process, log_path)
        self.procs.append(proc)
        return proc

    def start_api(self, timeout_s: float = 60.0) -> Proc:
        proc = self.spawn("api", "api")
        wait_until(lambda: _healthy(self.base_url), proc, timeout_s=timeout_s)
        return proc

    def start(
        self,
        workers: Sequence[str] = (),
        *,
        reaper: bool = True,
        timeout_s: float = START_TIMEOUT_S,
    ) -> list[Proc]:
        """The API, the reaper and the scheduler (unless `reaper` is false) and a worker of
        each of `workers` (pipeline names, or several names joined by `+` for one process of
        several on-demand pipelines), all spawned at once and then waited for together: the
        API until it answers, each worker until it says it is ready. Returns the workers."""
        api = self.spawn("api", "api")
        if reaper:
            self.start_reaper()
            self.start_scheduler()
        started = [self.start_worker(name.split("+"), wait=False) for name in workers]
        self.wait_started(started, api=api, timeout_s=timeout_s)
        return started

    def wait_started(
        self,
        workers: Sequence[Proc],
        *,
        api: Proc | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        """Until each of `workers` says it is ready (and the API answers, given `api`),
        failing at once, with its log, if one of them or the API exits."""
        waiting = [*workers, *([api] if api is not None else [])]

        def started() -> bool:
            self.check_alive(waiting)
            ready = all("ready." in proc.log() for proc in workers)
            return ready and (api is None or _healthy(self.base_url))

        try:
            wait_until(started, timeout_s=timeout_s)
        except TimeoutError:
            late = [p.name for p in workers if "ready." not in p.log()]
            detail = "\n".join(f"===== {p.name}\n{p.log()[-3000:]}" for p in waiting)
            raise TimeoutError(f"not started in {timeout_s:g}s: {late}\n{detail}") from None

    def start_worker(
        self,
        pipeline: str | Sequence[str],
        instance: int | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
        wait: bool = True,
    ) -> Proc:
        """A worker of `pipeline`, or one process for several on-demand pipelines
        (`mmq worker --pipeline A --pipeline B`); instance numbers count up per pipeline
        unless given. Waited for until it says it is ready unless `wait` is false."""
        names = [pipeline] if isinstance(pipeline, str) else list(pipeline)
        if instance is None:
            instance = max(self.instances.get(name, 0) for name in names)
        for name in names:
            self.instances[name] = max(self.instances.get(name, 0), instance + 1)
        proc = self.spawn(
            f"worker-{'+'.join(names)}-{instance}-{len(self.procs)}",
            "worker",
            *(arg for name in names for arg in ("--pipeline", name)),
            "--instance",
            str(instance),
            env=env,
        )
        if wait:
            wait_until(lambda: "ready." in proc.log(), proc, timeout_s=timeout_s)
        return proc

    def wait_ready(self, timeout_s: float = 60.0, url: str | None = None) -> None:
        """Until `/readyz` answers 200 (Redis up, a live worker of each kind), failing at
        once if one of the deployment's processes exited. `url`: another API's (a bench's
        `--url`) instead of this deployment's."""
        url = url or self.base_url
        last = "no answer"

        def ready() -> bool:
            nonlocal last
            self.check_alive()
            try:
                response = httpx.get(f"{url}/readyz", timeout=2, trust_env=False)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
                return False
            last = f"{response.status_code} {response.text[:200]}"
            return response.status_code == 200

        try:
            wait_until(ready, timeout_s=timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{url}/readyz not ready in {timeout_s:g}s: {last}") from None

    def check_alive(self, procs: Sequence[Proc] | None = None) -> None:
        """Raise RuntimeError, with the end of its log, if one of `procs` (default: the
        deployment's) has exited."""
        for proc in self.procs if procs is None else procs:
            if not proc.alive():
                code = proc.process.returncode
                raise RuntimeError(f"{proc.name} exited with {code}:\n{proc.log()[-4000:]}")

    def pids(self, prefix: str) -> list[int]:
        """The pids of the running processes whose name starts with `prefix` ("api",
        "worker-llm-")."""
        return [p.process.pid for p in self.procs if p.name.startswith(prefix) and p.alive()]

    def start_reaper(self) -> Proc:
        return self.spawn("reaper", "reaper")

    def start_scheduler(self) -> Proc:
        """`mmq scheduler`: fair share's holds, batches, on-demand turns, rooms."""
        return self.spawn("scheduler", "scheduler")

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to every process group at once, then wait for them all (SIGKILL to those
        still running `timeout_s` after)."""
        stop_all(self.procs, timeout_s)
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
    config_values: ConfigValues | None = None,
    *,
    test_pipelines: bool = True,
    reaper: bool = True,
    worker_timeout_s: float = 30.0,
) -> Iterator[Deployment]:
    """A deployment on `redis_url`: the API, the reaper, the scheduler and `workers`
    (pipeline names; a name given twice starts two instances) started and ready;
    everything stopped after."""
    dep = Deployment(
        redis_url,
        tmp,
        env,
        config_values or ConfigValues(),
        config=config,
        test_pipelines=test_pipelines,
    )
    with serving(dep):
        dep.start(workers, reaper=reaper, timeout_s=max(START_TIMEOUT_S, worker_timeout_s))
        yield dep


@contextlib.contextmanager
def private_deployment(
    config: str,
    env: dict[str, str],
    workers: Sequence[str],
    prefix: str = "mmq-bench-",
    *,
    test_pipelines: bool = True,
    reaper: bool = True,
    worker_timeout_s: float = 30.0,
    redis: RedisServer | None = None,
) -> Iterator[Deployment]:
    """`running` on a Redis of its own (`redis`, or one on a free port without
    persistence) in a temporary directory that is removed after."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
        if redis is None:
            redis = RedisServer(tmp / "redis", port=free_port(), persist=False)
        redis.start()
        stack.callback(redis.stop)
        (tmp / "deploy").mkdir()
        yield stack.enter_context(
            running(
                redis.url,
                tmp / "deploy",
                env,
                workers,
                config,
                test_pipelines=test_pipelines,
                reaper=reaper,
                worker_timeout_s=worker_timeout_s,
            )
        )


def stop_all(procs: Sequence[Proc], timeout_s: float = 10.0) -> None:
    """SIGTERM to the process group of each of `procs` that still runs, all at once, then
    wait for them together; SIGKILL to those still running `timeout_s` after."""
    live = [proc for proc in procs if proc.alive()]
    for proc in live:
        proc.kill(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in live:
        try:
            proc.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill(signal.SIGKILL)
            proc.process.wait()


def responds(url: str) -> bool:
    """Whether a GET of `url` answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _healthy(base_url: str) -> bool:
    return responds(f"{base_url}/healthz")


def wait_until(
    check: Callable[..., object], proc: Proc | None = None, timeout_s: float = 20.0
) -> None:
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
    return JobLookup(r).status_events(job_id)


def running_on(r: redis.Redis, proc: Proc, prefix: str = "") -> list[str]:
    """The running jobs (ids starting with `prefix`) that the worker process `proc` holds,
    as their records name it."""
    jobs = JobLookup(r)
    return [
        job_id
        for job_id in jobs.running()
        if job_id.startswith(prefix) and jobs.worker_of(job_id).endswith(f".{proc.process.pid}")
    ]


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


def live_in_group(pgid: int) -> list[int]:
    """The pids of the processes of process group `pgid` that still run (not zombies): what
    an engine started in its own session leaves behind once its leader is gone."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found
