"""Starts and supervises the processes of a deployment; restarts a dead one with backoff.

Each child runs in its own process group and dies with its parent (PR_SET_PDEATHSIG on
Linux), so Ctrl-C or a killed launcher leaves no orphan behind.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.procs import die_with_parent, stop_groups

log = logging.getLogger(__name__)


@dataclass
class ProcSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    why_exited: Callable[[int], str | None] | None = None
    """Given the pid of the child that exited: one line on why (a worker that failed to
    start says so in Redis), or None when there is nothing to add."""


@dataclass
class Child:
    spec: ProcSpec
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started_at: float = 0.0


def mmq_command(*args: str) -> list[str]:
    """argv that runs `mmq ARGS...` with this interpreter."""
    return [sys.executable, "-m", "mmq.cli", *args]


class Supervisor:
    def __init__(
        self,
        specs: list[ProcSpec],
        *,
        base_env: dict[str, str] | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_s: float = 30.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.children = [Child(spec) for spec in specs]
        self.stop_timeout_s = stop_timeout_s
        """How long the children have to exit once told to stop (SIGTERM), before SIGKILL:
        a worker's `shutdown_grace_s` and its hand-back."""
        self.base_env = base_env if base_env is not None else dict(os.environ)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_s = stable_s
        self._stop = threading.Event()

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        env = {**self.base_env, **child.spec.env}
        child.process = subprocess.Popen(
            child.spec.argv,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        child.started_at = time.monotonic()
        log.info("started %s (pid %d)", child.spec.name, child.process.pid)

    def check(self) -> None:
        """Restart children that died, each after its backoff."""
        now = time.monotonic()
        for child in self.children:
            proc = child.process
            if proc is not None and proc.poll() is None:
                continue
            if proc is not None:
                if now - child.started_at > self.stable_s:
                    child.restarts = 0
                delay = min(self.max_backoff_s, self.backoff_s * 2**child.restarts)
                self._explain(child.spec, proc.pid)
                log.warning(
                    "%s exited with %s; restarting in %.1fs",
                    child.spec.name,
                    proc.returncode,
                    delay,
                )
                child.restarts += 1
                child.next_start = now + delay
                child.process = None
            if now >= child.next_start:
                self._spawn(child)

    def _explain(self, spec: ProcSpec, pid: int) -> None:
        if spec.why_exited is None:
            return
        try:
            why = spec.why_exited(pid)
        except Exception:  # an explanation never stops the supervisor
            log.debug("no explanation for %s", spec.name, exc_info=True)
            return
        if why:
            log.error("%s: %s", spec.name, why)

    def run(self, poll_s: float = 0.5, on_pass: Callable[[], None] | None = None) -> None:
        """Supervise until `stop()` (or SIGINT/SIGTERM in the main thread); `on_pass`
        runs every pass before the children are checked (the embedded Redis's revive)."""
        self.start()
        while not self._stop.wait(poll_s):
            if on_pass is not None:
                on_pass()
            self.check()
        self.terminate(self.stop_timeout_s)

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once `stop()` is called."""
        return self._stop

    def terminate(self, timeout_s: float = 10.0) -> None:
        stop_groups([c.process for c in self.children if c.process is not None], timeout_s)
        for child in self.children:
            child.process = None
