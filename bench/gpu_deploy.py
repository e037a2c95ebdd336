"""The private mmq deployment that `bench.gpu` measures through: its own Redis, the API,
and groups of workers started and stopped section by section.

Everything runs as it would in production: `RedisServer`, and `mmq api` / `mmq worker`
processes (the harness's deployment, each logging to a file). A worker counts as loaded
once it has registered in Redis, which it does after its pipeline's `load()` and
`warmup()`: the time from its start to then is its load-and-warm time (process start and
imports included).
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from common.procs import stop_groups
from host.devices import discover
from host.redis_server import RedisServer
from host.up import pinned_env
from jobs import keys
from tuning.deployment import Deployment as Processes
from tuning.deployment import Proc, wait_until

LOAD_TIMEOUT_S = 900.0
LOG_TAIL_CHARS = 3000
BENCH_ENV = {
    "MMQ_LOG_LEVEL": "WARNING",
    "MMQ_API__HOST": "127.0.0.1",
    "MMQ_AUTH__REQUIRED": "false",
}


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

    procs: dict[tuple[str, int], Proc]
    """By pipeline and instance."""
    instances: dict[str, int]
    first: int
    started_at: float
    loaded_s: dict[str, list[float]] = field(default_factory=dict)
    """Per pipeline: seconds from start to registered, one per instance."""

    def pids_of(self, pipeline: str) -> list[int]:
        """The process ids of `pipeline`'s workers and their children (an LLM engine)."""
        roots = [p.process.pid for (name, _), p in self.procs.items() if name == pipeline]
        return [pid for root in roots for pid in _tree(root)]

    def tails(self) -> str:
        return "\n".join(f"{p.name}: {p.log()[-LOG_TAIL_CHARS:]}" for p in self.procs.values())


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
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmq-gpu-")))
        server = RedisServer(tmp / "redis", persist=False).start()
        stack.callback(server.stop)
        self.redis = redis.Redis.from_url(server.url, decode_responses=True)
        config = "\n".join(toml_tables(f"pipelines.{n}", t) for n, t in pipelines.items())
        self.procs = Processes(
            server.url, tmp, BENCH_ENV | env, config=config, test_pipelines=False
        )
        stack.callback(self.close)
        self.pipelines = pipelines
        self.topology = discover()
        self.api_url = self.procs.base_url
        self.api = self.procs.spawn("api", "api")

    def wait_api(self) -> None:
        """The API answers (workers may still be loading)."""

        def healthy() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                url = f"{self.api_url}/healthz"
                return httpx.get(url, timeout=2, trust_env=False).status_code == 200
            return False

        wait_until(healthy, self.api, timeout_s=60)

    def upload(self, data: bytes, name: str) -> str:
        files = {"file": (name, data, "application/octet-stream")}
        r = httpx.post(f"{self.api_url}/v1/files", files=files, timeout=60, trust_env=False)
        r.raise_for_status()
        return str(r.json()["key"])

    def start(self, instances: dict[str, int], first: int = 0) -> Workers:
        """Start `instances[p]` workers of each pipeline `p` (at once), numbered from
        `first`."""
        procs: dict[tuple[str, int], Proc] = {}
        for name, count in instances.items():
            # Pinned as `mmq up` pins: CUDA_VISIBLE_DEVICES is the device's UUID (NVML).
            where = self.pipelines[name]["device"]
            device = self.topology.get(where)
            if device is None:
                raise RuntimeError(f"{name}: device {where} not found ({self.topology.note})")
            for i in range(first, first + count):
                env = pinned_env(device)
                procs[name, i] = self.procs.start_worker(name, i, env, wait=False)
        return Workers(procs, dict(instances), first, time.monotonic())

    def wait_loaded(self, workers: Workers, timeout_s: float = LOAD_TIMEOUT_S) -> None:
        """Return once every worker of the group has registered; fill `loaded_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.procs.check_alive(list(workers.procs.values()))
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
                    f"their logs end with:\n{workers.tails()}"
                )
            time.sleep(0.1)

    def check(self, workers: Workers) -> dict[str, Any]:
        """What the deployment says of the group's workers, as an operator would look:
        each worker's device and pinning (its CUDA_VISIBLE_DEVICES), the devices with
        their last NVML reading (the admin overview) and `/metrics`' GPU series."""
        get = functools.partial(httpx.get, timeout=30, trust_env=False)
        overview = get(f"{self.api_url}/v1/admin/overview").json()
        metrics = get(f"{self.api_url}/metrics").text
        pinned = {
            key: _environ(p.process.pid).get("CUDA_VISIBLE_DEVICES")
            for key, p in workers.procs.items()
        }
        ours = {f"{p}-{i}" for p, i in workers.procs}
        return {
            "workers": [
                {
                    "name": w["name"],
                    "device": w["device"],
                    "cuda_visible_devices": pinned.get((w["pipeline"], w["instance"])),
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
        gone = [p for (name, i), p in workers.procs.items() if name == pipeline and i >= keep]
        stop_groups([p.process for p in gone], 30)
        deadline = time.monotonic() + 30
        while self._registered().get(pipeline, 0) > keep and time.monotonic() < deadline:
            time.sleep(0.1)

    def close(self) -> None:
        """Stop every process: all are asked at once, then each is waited for."""
        stop_groups([p.process for p in self.procs.procs])

    def stop(self, workers: Workers) -> None:
        stop_groups([p.process for p in workers.procs.values()])
        deadline = time.monotonic() + 30
        while any(self._registered().get(n, 0) > workers.first for n in workers.instances):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
