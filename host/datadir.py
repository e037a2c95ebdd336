"""One `mmq up` per data dir: an exclusive lock on `DATA_DIR/mmq-up.lock`, held for the
life of the process (the kernel drops it when the process ends, however it ends: no
stale lock to clean up). The lock file says who holds it (pid, Redis URL, API URL), so a
second `mmq up` on the same data dir is refused at once, naming the first, before it
starts anything that could break it (its embedded Redis on the first's port, its API on
the first's address, its stop removing the first's Redis URL file).

While it holds the lock, an `mmq up` is also listed in the user's index of running ones
(`index_dir()`: a file per data dir naming it), so that a command run from another
directory (`mmq keys create`) finds it (`running_data_dirs`)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path

LOCK_FILE = "mmq-up.lock"


def index_dir() -> Path:
    """Where this user's running `mmq up`s are listed: `$XDG_STATE_HOME/mmq/up`
    (`~/.local/state/mmq/up` by default)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "mmq" / "up"


def _index_entry(data_dir: Path) -> Path:
    return index_dir() / hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]


def held(data_dir: Path) -> bool:
    """Whether an `mmq up` holds `data_dir`'s lock now."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the lock if it was taken here
    return False


def running_data_dirs() -> list[Path]:
    """The data dirs of this user's `mmq up`s that run now. An entry whose `mmq up` is
    gone (killed, so it could not remove it) is removed here."""
    found = []
    for entry in sorted(index_dir().glob("*")):
        with contextlib.suppress(OSError):
            data_dir = Path(entry.read_text())
            if held(data_dir):
                found.append(data_dir)
            else:
                entry.unlink()
    return found


class DataDirInUse(Exception):
    """Another `mmq up` holds the data dir."""


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.resolve()
        self.path = self.data_dir / LOCK_FILE
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
        with contextlib.suppress(OSError):  # the index is a convenience: never a reason to fail
            entry = _index_entry(self.data_dir)
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.write_text(str(self.data_dir))
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
            _index_entry(self.data_dir).unlink()
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
