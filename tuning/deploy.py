"""A private deployment for a tune: Redis in memory, one API process, and each
candidate's workers, all on loopback, under a work directory; nothing of the user's
deployment is touched. The API starts once; workers start per candidate (their knobs
are read at start) and stop after it.
"""

from __future__ import annotations

import time
import tomllib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import tomlkit

from common.procs import stop_groups
from host.redis_server import RedisServer
from jobs.settings import PipelineConfig
from jobstore.liveness import LivenessStore
from tuning.deployment import Deployment, Proc

LOG_TAIL_CHARS = 1500
STOP_TIMEOUT_S = 15.0
"""How long stopped workers get to exit before SIGKILL."""


class CandidateFailed(Exception):
    """A candidate's workers did not start, or died: the reason, for the report."""


@dataclass
class Workers:
    pids: list[int]
    start_s: float
    """From spawning the processes to every one of them being live (model loads included)."""


class TuneDeployment:
    """The harness's deployment as the user's own processes would run (their working
    directory and environment less its MMQ_ settings), on a Redis of its own."""

    def __init__(self, raw: dict[str, Any], pipeline: str, workdir: Path) -> None:
        self.raw = raw
        """The user's config as TOML data (empty without a file): kept as the user wrote
        it, keys unknown to `Settings` included, so it stays a TOML document."""
        self.pipeline = pipeline
        self.workdir = workdir
        self.redis = RedisServer(workdir / "redis", persist=False)
        self.dep = Deployment(
            self.redis.url, workdir, config=self.config(None), test_pipelines=False, test_env=False
        )
        self.base_url = self.dep.base_url
        self.workers: list[Proc] = []
        self._stack = ExitStack()

    def __enter__(self) -> TuneDeployment:
        with ExitStack() as stack:
            self.redis.start()
            stack.callback(self.redis.stop)
            stack.callback(self.dep.stop)
            self.dep.start_api(timeout_s=60)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def config(self, pipeline: PipelineConfig | None) -> str:
        """The user's config, with no auth, its API on loopback, its Redis in memory, its
        files local, every other pipeline off, and `pipeline`'s knobs (where given) in
        `[pipelines.NAME]`. The deployment's environment gives the Redis URL, data dir
        (in the work directory) and port."""
        data = dict(self.raw)
        data["api"] = {**data.get("api", {}), "host": "127.0.0.1"}
        data["auth"] = {**data.get("auth", {}), "required": False}
        data["redis"] = {**data.get("redis", {}), "durability": "memory"}
        data["storage"] = {**data.get("storage", {}), "backend": "local", "local_shared": False}
        data["queue"] = {**data.get("queue", {}), "max_queued": 100_000, "max_queued_by_kind": {}}
        data["webhooks"] = {k: v for k, v in data.get("webhooks", {}).items() if k != "secret"}
        pipes = {
            other: {**table, "enabled": other == self.pipeline}
            for other, table in data.get("pipelines", {}).items()
        }
        if pipeline is not None:
            dumped = pipeline.model_dump(by_alias=True, exclude_none=True)
            pipes[self.pipeline] = {**pipes.get(self.pipeline, {}), **dumped, "enabled": True}
        data["pipelines"] = pipes
        return tomlkit.dumps(data)

    def start_workers(self, label: str, config: PipelineConfig, timeout_s: float) -> Workers:
        """`config.instances` worker processes with these knobs; returns once every one
        is live. Raises CandidateFailed (workers stopped) when one exits or is not live
        within `timeout_s`."""
        path = self.workdir / f"{label}.toml"
        path.write_text(self.config(config))
        started = time.monotonic()
        env = {"MMQ_CONFIG_FILE": str(path)}
        self.workers = [
            self.dep.start_worker(self.pipeline, i, env, wait=False)
            for i in range(config.instances)
        ]
        try:
            self._wait_live(timeout_s)
        except CandidateFailed:
            self.stop_workers()
            raise
        return Workers([w.process.pid for w in self.workers], time.monotonic() - started)

    def stop_workers(self) -> None:
        stop_groups([w.process for w in self.workers], STOP_TIMEOUT_S)
        self.workers = []

    def upload(self, client: httpx.Client, path: Path) -> str:
        with path.open("rb") as handle:
            answer = client.post("/v1/files", files={"file": (path.name, handle)})
        answer.raise_for_status()
        return str(answer.json()["key"])

    def _wait_live(self, timeout_s: float) -> None:
        r = redis.Redis.from_url(self.redis.url, decode_responses=True)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for proc in self.workers:
                    if not proc.alive():
                        raise CandidateFailed(self._why(r, proc))
                live = {name.rpartition(".")[2] for name in LivenessStore(r).worker_names()}
                if all(str(proc.process.pid) in live for proc in self.workers):
                    return
                time.sleep(0.1)
        finally:
            r.close()
        raise CandidateFailed(f"workers not live within {timeout_s:.0f}s")

    def _why(self, r: redis.Redis, proc: Proc) -> str:
        state = LivenessStore(r).start_of(self.pipeline)
        if state.get("state") == "failed" and state.get("pid") == str(proc.process.pid):
            return f"worker failed to start: {state.get('reason', '').strip()}"[:LOG_TAIL_CHARS]
        tail = proc.log()[-LOG_TAIL_CHARS:].strip().splitlines()[-3:]
        return f"worker exited with {proc.process.returncode}: " + " | ".join(tail)


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with path.open("rb") as handle:
        return tomllib.load(handle)
