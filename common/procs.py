"""Process helpers for whatever starts a child process or a server."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child (as `preexec_fn`): get SIGTERM when the parent dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on `host:port` (a bind there fails as a server's would:
    with SO_REUSEADDR, as uvicorn and Redis bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """`sig` to the process group that `proc` leads (started with `start_new_session`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """SIGTERM every process group at once, then SIGKILL those still running after
    `timeout_s` in all; returns once every process has exited."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in running:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
