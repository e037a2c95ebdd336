"""A private deployment for a tune: Redis in memory, one API process, and each
candidate's workers, all on loopback, under a work directory; nothing of the user's
deployment is touched. The API starts once; workers start per candidate (their knobs
are read at start) and stop after it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
import tomlkit

from common.procs import die_with_parent, free_port, stop_groups
from host.launcher import mmq_command
from host.redis_server import RedisServer
from jobs import keys
from jobs.codec import text_map
from jobs.settings import PipelineConfig

LOG_TAIL_CHARS = 1500
STOP_TIMEOUT_S = 15.0
"""How long stopped processes get to exit before SIGKILL."""


class CandidateFailed(Exception):
    """A candidate's workers did not start, or died: the reason, for the report."""


@dataclass
class Workers:
    pids: list[int]
    start_s: float
    """From spawning the processes to every one of them being live (model loads included)."""


class TuneDeployment:
    def __init__(self, raw: dict[str, Any], pipeline: str, workdir: Path) -> None:
        self.raw = raw
        """The user's config as TOML data (empty without a file)."""
        self.pipeline = pipeline
        self.workdir = workdir
        self.redis: RedisServer | None = None
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MMQ_")}
        self._names: dict[int, str] = {}

    def __enter__(self) -> TuneDeployment:
        try:
            self.redis = RedisServer(self.workdir / "redis", persist=False).start()
            base = self.write_config("api", None)
            self.api = self._spawn("api", mmq_command("api", "--config", str(base)))
            self._wait_api()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop_workers()
        if self.api is not None:
            stop_groups([self.api], STOP_TIMEOUT_S)
            self.api = None
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def write_config(self, name: str, pipeline: PipelineConfig | None) -> Path:
        """The user's config, with this deployment's Redis (in memory), port, data and
        files (local, in the work directory), no auth, every other pipeline off, and
        `pipeline`'s knobs (where given) in `[pipelines.NAME]`."""
        assert self.redis is not None
        data = {k: v for k, v in self.raw.items() if k not in ("redis_url", "data_dir")}
        data["redis_url"] = self.redis.url
        data["data_dir"] = str(self.workdir / "data")
        data["api"] = {**data.get("api", {}), "host": "127.0.0.1", "port": self.port}
        data["auth"] = {**data.get("auth", {}), "required": False}
        # Its own Redis keeps nothing on disk, its files stay in the work directory.
        data["redis"] = {**data.get("redis", {}), "durability": "memory"}
        data["storage"] = {**data.get("storage", {}), "backend": "local", "local_shared": False}
        data["queue"] = {**data.get("queue", {}), "max_queued": 100_000, "max_queued_by_kind": {}}
        data["webhooks"] = {k: v for k, v in data.get("webhooks", {}).items() if k != "secret"}
        pipes: dict[str, Any] = {}
        for other, table in data.get("pipelines", {}).items():
            pipes[other] = {**table, "enabled": other == self.pipeline}
        if pipeline is not None:
            dumped = pipeline.model_dump(by_alias=True, exclude_none=True)
            pipes[self.pipeline] = {**pipes.get(self.pipeline, {}), **dumped, "enabled": True}
        data["pipelines"] = pipes
        path = self.workdir / f"{name}.toml"
        path.write_text(tomlkit.dumps(data))
        return path

    def start_workers(self, label: str, config: PipelineConfig, timeout_s: float) -> Workers:
        """`config.instances` worker processes with these knobs; returns once every one
        is live. Raises CandidateFailed (workers stopped) when one exits or is not live
        within `timeout_s`."""
        path = self.write_config(label, config)
        started = time.monotonic()
        for instance in range(config.instances):
            argv = mmq_command(
                "worker", "--pipeline", self.pipeline, "--instance", str(instance),
                "--config", str(path),
            )  # fmt: skip
            self.workers.append(self._spawn(f"{label}-worker{instance}", argv))
        try:
            self._wait_live(timeout_s)
        except CandidateFailed:
            self.stop_workers()
            raise
        return Workers([w.pid for w in self.workers], time.monotonic() - started)

    def stop_workers(self) -> None:
        stop_groups(self.workers, STOP_TIMEOUT_S)
        self.workers = []

    def upload(self, client: httpx.Client, path: Path) -> str:
        with path.open("rb") as handle:
            answer = client.post("/v1/files", files={"file": (path.name, handle)})
        answer.raise_for_status()
        return str(answer.json()["key"])

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )  # fmt: skip
        finally:
            log.close()
        self._names[proc.pid] = name
        return proc

    def _wait_api(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api is not None and self.api.poll() is not None:
                raise RuntimeError(f"the tune's API exited:\n{self._log_tail('api')}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the tune's API did not answer within {timeout_s:.0f}s")

    def _wait_live(self, timeout_s: float) -> None:
        assert self.redis is not None
        r = redis.Redis.from_url(self.redis.url, decode_responses=True)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for proc in self.workers:
                    if proc.poll() is not None:
                        raise CandidateFailed(self._why(r, proc))
                live = {str(name).rpartition(".")[2] for name in r.zrange(keys.WORKERS, 0, -1)}
                if all(str(proc.pid) in live for proc in self.workers):
                    return
                time.sleep(0.1)
        finally:
            r.close()
        raise CandidateFailed(f"workers not live within {timeout_s:.0f}s")

    def _why(self, r: redis.Redis, proc: subprocess.Popen[bytes]) -> str:
        state = text_map(r.hgetall(keys.pipeline_state(self.pipeline)))
        if state.get("state") == "failed" and state.get("pid") == str(proc.pid):
            return f"worker failed to start: {state.get('reason', '').strip()}"[:LOG_TAIL_CHARS]
        tail = self._log_tail(self._names.get(proc.pid, "")).strip().splitlines()[-3:]
        return f"worker exited with {proc.returncode}: " + " | ".join(tail)

    def _log_tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace")[-LOG_TAIL_CHARS:] if name and path.exists() else ""


def read_config(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    with path.open("rb") as handle:
        return tomllib.load(handle)
