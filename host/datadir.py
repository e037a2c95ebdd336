"""One `mmq up` per data dir: an exclusive lock on `DATA_DIR/mmq-up.lock`, held for the
life of the process (the kernel drops it when the process ends, however it ends: no
stale lock to clean up). The lock file says who holds it (pid, Redis URL, API URL), so a
second `mmq up` on the same data dir is refused at once, naming the first, before it
starts anything that could break it (its embedded Redis on the first's port, its API on
the first's address, its stop removing the first's Redis URL file)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

LOCK_FILE = "mmq-up.lock"


class DataDirInUse(Exception):
    """Another `mmq up` holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None
        self._info: dict[str, str | int | None] = {}
        """What the lock file says: the holder's pid, Redis and API URLs."""

    def acquire(self, **info: str | None) -> DataDirLock:
        """Take the lock (raises DataDirInUse, naming the holder) and note `info`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(self._refusal()) from None
        self._fd = fd
        self.note(pid=os.getpid(), **info)
        return self

    def note(self, **info: str | int | None) -> None:
        """Add `info` (the Redis URL, once known) to what the lock file says."""
        if self._fd is None:
            return
        self._info.update(info)
        data = json.dumps(self._info).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # drops the lock
        self._fd = None

    def _refusal(self) -> str:
        try:
            holder = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            holder = {}
        said = ", ".join(
            f"{what} {holder[key]}"
            for key, what in (("pid", "pid"), ("redis", "Redis"), ("api", "API"))
            if holder.get(key)
        )
        return (
            f"data dir {self.path.parent} is in use by another `mmq up`"
            + (f" ({said})" if said else "")
            + ": stop it first, or give this one a data dir of its own (MMQ_DATA_DIR)"
        )

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
