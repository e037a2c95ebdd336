"""The private mmq deployment that `bench.gpu` measures through: its own Redis, the API,
and groups of workers started and stopped section by section.

Everything runs as it would in production: `RedisServer`, and `mmq api` / `mmq worker`
processes under a `Supervisor`. A worker counts as loaded once it has registered in
Redis, which it does after its pipeline's `load()` and `warmup()`: the time from its
start to then is its load-and-warm time (process start and imports included).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.common import check_alive, child_env, wait_healthy
from common.procs import free_port
from host.devices import discover
from host.launcher import ProcSpec, Supervisor, mmq_command
from host.redis_server import RedisServer
from host.up import pinned_env
from jobs import keys

LOAD_TIMEOUT_S = 900.0
LOG_TAIL_BYTES = 3000


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr at `path` while children are spawned: they
    inherit the descriptors and write there (Celery's banners, model loading bars)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def tail(path: Path) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
        return f.read().decode(errors="replace")


def toml_tables(prefix: str, table: dict[str, Any]) -> str:
    """`table` as TOML under `[prefix]`: plain values first, then each sub-table."""
    plain = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    text = f"[{prefix}]\n" + "".join(line + "\n" for line in plain)
    for key, value in table.items():
        if isinstance(value, dict):
            text += "\n" + toml_tables(f"{prefix}.{key}", value)
    return text


@dataclass
class Workers:
    """A group of worker processes: pipeline -> instances, numbered from `first` (the
    lower numbers are an earlier group's, still running)."""

    supervisor: Supervisor
    instances: dict[str, int]
    first: int
    started_at: float
    log: Path
    loaded_s: dict[str, list[float]] = field(default_factory=dict)
    """Per pipeline: seconds from start to registered, one per instance."""

    def pids_of(self, pipeline: str) -> list[int]:
        """The process ids of `pipeline`'s workers and their children (an LLM engine)."""
        roots = [
            c.process.pid
            for c in self.supervisor.children
            if c.spec.name.startswith(f"{pipeline}#") and c.process is not None
        ]
        return [pid for root in roots for pid in _tree(root)]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def _tree(pid: int) -> list[int]:
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            found += _tree(int(child))
    return found


class Deployment:
    """Redis and the API, for `pipelines` (name -> its config table); the API is
    started, not waited for (`wait_api`)."""

    def __init__(
        self, stack: ExitStack, pipelines: dict[str, dict[str, Any]], env: dict[str, str]
    ) -> None:
        self.stack = stack
        self.tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-gpu-")))
        server = RedisServer(self.tmp / "redis", port=free_port(), persist=False)
        server.start()
        stack.callback(server.stop)
        self.redis = redis.Redis.from_url(server.url, decode_responses=True)
        config = self.tmp / "mmq.toml"
        config.write_text("\n".join(toml_tables(f"pipelines.{n}", t) for n, t in pipelines.items()))
        self.pipelines = pipelines
        self.topology = discover()
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        self.env = child_env(config, server.url, self.tmp / "data") | {
            "MMQ_API__PORT": str(port),
            **env,
        }
        self.api = Supervisor([ProcSpec("api", mmq_command("api"))], base_env=self.env)
        self.supervisors = [self.api]
        stack.callback(self.close)
        with output_to(self.tmp / "logs" / "api.log"):
            self.api.start()

    def wait_api(self) -> None:
        """The API answers (workers may still be loading)."""
        try:
            wait_healthy(self.api_url, self.api)
        except RuntimeError as exc:
            log = tail(self.tmp / "logs" / "api.log")
            raise RuntimeError(f"{exc}; its log ends with:\n{log}") from None

    def upload(self, data: bytes, name: str) -> str:
        files = {"file": (name, data, "application/octet-stream")}
        r = httpx.post(f"{self.api_url}/v1/files", files=files, timeout=60, trust_env=False)
        r.raise_for_status()
        return str(r.json()["key"])

    def start(self, instances: dict[str, int], first: int = 0) -> Workers:
        """Start `instances[p]` workers of each pipeline `p` (at once), numbered from
        `first`."""
        specs = []
        for name, count in instances.items():
            # Pinned as `mmq up` pins: CUDA_VISIBLE_DEVICES is the device's UUID (NVML).
            where = self.pipelines[name]["device"]
            device = self.topology.get(where)
            if device is None:
                raise RuntimeError(f"{name}: device {where} not found ({self.topology.note})")
            for i in range(first, first + count):
                argv = mmq_command("worker", "--pipeline", name, "--instance", str(i))
                specs.append(ProcSpec(f"{name}#{i}", argv, pinned_env(device)))
        supervisor = Supervisor(specs, base_env=self.env)
        self.supervisors.append(supervisor)
        log = self.tmp / "logs" / f"{'+'.join(instances)}.log"
        with output_to(log):
            supervisor.start()
        return Workers(supervisor, dict(instances), first, time.monotonic(), log)

    def wait_loaded(self, workers: Workers, timeout_s: float = LOAD_TIMEOUT_S) -> None:
        """Return once every worker of the group has registered; fill `loaded_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                check_alive(workers.supervisor)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; its log ends with:\n{tail(workers.log)}") from None
            counts = self._registered()
            now = time.monotonic() - workers.started_at
            for name, want in workers.instances.items():
                times = workers.loaded_s.setdefault(name, [])
                new = min(counts.get(name, 0) - workers.first, want)
                times += [now] * (new - len(times))
            if all(len(workers.loaded_s[n]) >= c for n, c in workers.instances.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers not loaded in {timeout_s:g}s: {workers.loaded_s}; "
                    f"their log ends with:\n{tail(workers.log)}"
                )
            time.sleep(0.1)

    def check(self, workers: Workers) -> dict[str, Any]:
        """What the deployment says of the group's workers, as an operator would look:
        each worker's device and pinning (its CUDA_VISIBLE_DEVICES), the devices with
        their last NVML reading (the admin overview) and `/metrics`' GPU series."""
        get = functools.partial(httpx.get, timeout=30, trust_env=False)
        overview = get(f"{self.api_url}/v1/admin/overview").json()
        metrics = get(f"{self.api_url}/metrics").text
        pinned: dict[str, str | None] = {}
        for child in workers.supervisor.children:
            if child.process is not None:
                pinned[child.spec.name] = _environ(child.process.pid).get("CUDA_VISIBLE_DEVICES")
        ours = {
            f"{p}-{i}"
            for p, n in workers.instances.items()
            for i in range(workers.first, workers.first + n)
        }
        return {
            "workers": [
                {
                    "name": w["name"],
                    "device": w["device"],
                    "cuda_visible_devices": pinned.get(f"{w['pipeline']}#{w['instance']}"),
                    "up": w["up"],
                }
                for w in overview["workers"]
                if w["name"].split("@", 1)[0] in ours
            ],
            "devices": overview.get("devices", []),
            "gpu_metrics": [line for line in metrics.splitlines() if line.startswith("mmq_gpu_")],
        }

    def _registered(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for name in self.redis.zrange(keys.WORKERS, 0, -1):
            pipeline = str(name).split("@", 1)[0].rsplit("-", 1)[0]
            counts[pipeline] = counts.get(pipeline, 0) + 1
        return counts

    def shrink(self, workers: Workers, pipeline: str, keep: int) -> None:
        """Stop `pipeline`'s workers of this group numbered `keep` and up; return once
        they have left the registry."""
        for child in workers.supervisor.children:
            name, _, index = child.spec.name.partition("#")
            if name == pipeline and int(index) >= keep and child.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGTERM)
                child.process.wait(30)
        deadline = time.monotonic() + 30
        while self._registered().get(pipeline, 0) > keep and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        """Stop every process: all are asked at once, then each is waited for."""
        for supervisor in self.supervisors:
            for child in supervisor.children:
                if child.process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.process.pid, signal.SIGTERM)
        for supervisor in reversed(self.supervisors):
            supervisor.terminate()

    def stop(self, workers: Workers) -> None:
        workers.supervisor.terminate()
        deadline = time.monotonic() + 30
        while any(self._registered().get(n, 0) > workers.first for n in workers.instances):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
