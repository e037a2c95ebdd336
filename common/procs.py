"""Process helpers for whatever starts a child process or a server."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket

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
