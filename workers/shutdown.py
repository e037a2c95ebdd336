"""A worker's stop on SIGTERM or SIGINT: it loses no job and counts no attempt.

Celery's warm shutdown (which both signals start) stops consuming and then waits, without
a bound, for the tasks that run. Alongside it, `Drain`:

1. closes every runner at once: a message the consumer still takes goes back to the
   front of its queue, unrun (`JobRunner.run` answers `STOPPING`);
2. lets the jobs held here run for `worker.shutdown_grace_s`;
3. asks those still running to stop (their engines' work is canceled: an LLM's sequences
   are aborted) and to queue their jobs again (`operations.hand_back`: under the run's
   lease, the attempt not counted), waiting `HAND_BACK_WAIT_S` for them;
4. hands back itself, under their leases, the jobs of runs that did not stop;
5. lets Celery's shutdown end (the tasks return and are acknowledged, the models unload)
   and, should a task thread stay busy in a pipeline that ignores its cancel, ends the
   process after `STRAGGLER_WAIT_S` (exit status 0: nothing it held is lost).

A job that ends while it is being handed back keeps that end: its lease decides which of
the two writes is made, and the other is refused.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery import signals

from workers.jobrunner import JobRunner

log = logging.getLogger(__name__)

POLL_S = 0.05
HAND_BACK_WAIT_S = 2.0
"""How long the runs asked to stop have to queue their jobs again themselves."""
STRAGGLER_WAIT_S = 5.0
"""How long, once all is handed back, the process waits for Celery's shutdown to end."""


def _exit_now() -> None:
    logging.shutdown()
    os._exit(0)


class Drain:
    """The stop of one worker process's runners (see the module's docstring)."""

    def __init__(
        self,
        runners: Sequence[JobRunner],
        grace_s: float,
        on_stuck: Callable[[], None] = _exit_now,
    ) -> None:
        self.runners = list(runners)
        self.grace_s = grace_s
        self.on_stuck = on_stuck
        self.done = threading.Event()
        """Every job held here has ended or been handed back."""
        self._exited = threading.Event()
        self._begun = threading.Lock()
        self._thread = threading.Thread(target=self.run, name="drain", daemon=True)

    def install(self) -> None:
        """Begin on Celery's warm shutdown (SIGTERM, the first SIGINT)."""
        signals.worker_shutting_down.connect(self._on_shutting_down, weak=False)

    def _on_shutting_down(self, how: str = "", **_: Any) -> None:
        if how == "Warm":
            self.begin()

    def begin(self) -> None:
        """Start the drain (once; later calls do nothing). Safe in a signal handler: it
        starts a thread and returns."""
        if not self._begun.acquire(blocking=False):
            return
        for runner in self.runners:
            runner.close()
        self._thread.start()

    def exited(self) -> None:
        """Celery's worker has returned: the process ends by itself."""
        self._exited.set()

    def _active(self) -> int:
        return sum(runner.active() for runner in self.runners)

    def _wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._active():
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def run(self) -> None:
        log.info("stopping: no new jobs; %d held, %gs to finish", self._active(), self.grace_s)
        if not self._wait_idle(self.grace_s):
            asked = sum(runner.ask_hand_back() for runner in self.runners)
            log.warning("stopping: grace over; handing back %d jobs", asked)
            if not self._wait_idle(HAND_BACK_WAIT_S):
                forced = sum(runner.hand_back_now() for runner in self.runners)
                log.warning("stopping: %d jobs handed back for runs that did not stop", forced)
        self.done.set()
        log.info("stopping: nothing held; exiting")
        if not self._exited.wait(STRAGGLER_WAIT_S):
            log.warning("stopping: a task thread is still busy; exiting without it")
            self.on_stuck()
