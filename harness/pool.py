"""Deployments shared by a test session, one per configuration and environment (`Spec`).

Each runs on a Redis server of its own, so that no test's flush of the session's Redis
touches it; tests on one are kept apart by owner (the `api` fixture's fresh key). A
deployment is started on first use, checked on every later one (started again if one of its
processes has exited: a test that kills a worker does not break the next module), and all
are stopped together at the end of the session."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from host.redis_server import RedisServer
from tuning.deployment import START_TIMEOUT_S, ConfigValues, Deployment, stop_all


@dataclass(frozen=True)
class Spec:
    """What a pooled deployment is: its workers (pipeline names), environment over the
    tests' (`Deployment.env`), config added to the tests' echo and sleep pipelines, and
    whether it has a reaper and a scheduler."""

    workers: tuple[str, ...] = ("echo", "sleep")
    env: tuple[tuple[str, str], ...] = ()
    config: str = ""
    reaper: bool = True

    @classmethod
    def of(
        cls, workers: tuple[str, ...], env: dict[str, str], config: str = "", reaper: bool = True
    ) -> Spec:
        return cls(workers, tuple(sorted(env.items())), config, reaper)


@dataclass
class _Held:
    server: RedisServer
    dep: Deployment


@dataclass
class DeploymentPool:
    """The session's deployments by `Spec`, in directories under `root`."""

    root: Path
    _held: dict[Spec, _Held] = field(default_factory=dict)
    _count: int = 0

    def get(self, spec: Spec) -> Deployment:
        """The running deployment of `spec`, started now unless it already runs whole."""
        held = self._held.get(spec)
        if held is not None and all(proc.alive() for proc in held.dep.procs):
            return held.dep
        if held is not None:
            self._close([self._held.pop(spec)])
        self._held[spec] = self._start(spec)
        return self._held[spec].dep

    def _start(self, spec: Spec) -> _Held:
        self._count += 1
        tmp = self.root / f"pooled-{self._count}"
        (tmp / "deploy").mkdir(parents=True)
        server = RedisServer(tmp / "redis", persist=False)
        server.start()
        dep = Deployment(
            server.url, tmp / "deploy", dict(spec.env), ConfigValues(), config=spec.config
        )
        try:
            dep.start(spec.workers, reaper=spec.reaper, timeout_s=START_TIMEOUT_S)
        except BaseException:
            print(dep.logs())
            self._close([_Held(server, dep)])
            raise
        return _Held(server, dep)

    def close(self) -> None:
        """Stop every deployment's processes at once, then their Redis servers."""
        self._close(list(self._held.values()))
        self._held.clear()

    @staticmethod
    def _close(held: list[_Held]) -> None:
        stop_all([proc for h in held for proc in h.dep.procs])
        for h in held:
            h.dep.procs.clear()
            with contextlib.suppress(Exception):
                h.server.stop()
