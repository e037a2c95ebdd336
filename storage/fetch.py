"""Resolving a job input's file reference into a stream or a local path, for workers.

A stored key (or an `s3://` URL on the configured bucket) is read from storage; an
http(s) URL is downloaded with httpx, streaming, through the SSRF guard at connect time
(every redirect hop too), into an unnamed temp file, and refused past
`storage.max_upload_bytes`. Every failure is an `InputError` naming the field, so the
job fails as bad input and is never retried.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import httpx

from jobs.errors import InputError, NotFound, TooLarge
from jobs.settings import Settings
from security.netguard import AddressRefused, GuardedTransport, NetPolicy
from storage.base import CHUNK_BYTES, Storage
from storage.local import LocalStorage
from storage.refs import parse_ref

_SUFFIX = re.compile(r"^\.[A-Za-z0-9]{1,10}$")
POLL_S = 0.25
"""How often a download's watcher looks whether the download ended (a cancel wakes it
at once)."""


class InputFetcher:
    def __init__(self, settings: Settings, storage: Storage, *, verify_tls: bool = True) -> None:
        self.settings = settings
        self.storage = storage
        self.policy = NetPolicy.from_settings(settings.net)
        self.verify_tls = verify_tls

    def open(
        self, ref: str, *, owner: str, field: str, cancel: threading.Event | None = None
    ) -> BinaryIO:
        """A readable stream of the referenced file. Close it. A download stops when
        `cancel` is set."""
        parsed = parse_ref(ref, field, owner, self.settings)
        if parsed.kind == "key":
            try:
                return self.storage.open(parsed.value)
            except NotFound:
                raise InputError(field, f"no stored file {parsed.value!r}") from None
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it
        try:
            self.download(parsed.value, field, spool, cancel)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool

    @contextlib.contextmanager
    def local_path(
        self, ref: str, *, owner: str, field: str, cancel: threading.Event | None = None
    ) -> Iterator[Path]:
        """A path to the referenced file while the block runs (a temp copy where needed;
        a local stored file is used in place: read it, never change it)."""
        parsed = parse_ref(ref, field, owner, self.settings)
        if parsed.kind == "key" and isinstance(self.storage, LocalStorage):
            yield _local_file(self.storage, parsed.value, field)
            return
        fd, name = tempfile.mkstemp(suffix=_suffix(parsed.value), prefix="mmq-input-")
        try:
            with (
                os.fdopen(fd, "wb") as out,
                self.open(ref, owner=owner, field=field, cancel=cancel) as src,
            ):
                shutil.copyfileobj(src, out, CHUNK_BYTES)
            yield Path(name)
        finally:
            Path(name).unlink(missing_ok=True)

    def download(
        self, url: str, field: str, out: BinaryIO, cancel: threading.Event | None = None
    ) -> int:
        """Stream `url` into `out`; returns the byte count. Stops at the deadline, or
        when `cancel` is set."""
        deadline_s = self.settings.net.fetch_deadline_s
        with _Watch(cancel, deadline_s) as watch:
            try:
                with self._client(watch.track) as client, client.stream("GET", url) as response:
                    return self._copy(response, field, out, watch)
            except AddressRefused as exc:
                raise InputError(field, f"is not allowed: {exc}") from None
            except httpx.TooManyRedirects:
                raise InputError(field, "redirects too many times") from None
            except (httpx.HTTPError, OSError) as exc:
                watch.check(field)  # a stop ends the read with an error of its own
                raise InputError(field, f"could not be fetched: {exc}") from None

    def _client(self, on_connect: Callable[[socket.socket], None]) -> httpx.Client:
        net = self.settings.net
        return httpx.Client(
            transport=GuardedTransport(self.policy, verify=self.verify_tls, on_connect=on_connect),
            follow_redirects=True,
            max_redirects=net.fetch_max_redirects,
            timeout=net.fetch_timeout_s,
            trust_env=False,
        )

    def _copy(self, response: httpx.Response, field: str, out: BinaryIO, watch: _Watch) -> int:
        if response.status_code != 200:
            raise InputError(field, f"GET answered {response.status_code}")
        limit = self.settings.storage.max_upload_bytes
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise TooLarge(field, f"is {length} bytes, over the limit of {limit} bytes")
        size = 0
        for chunk in response.iter_bytes(CHUNK_BYTES):
            watch.check(field)
            size += len(chunk)
            if size > limit:
                raise TooLarge(field, f"is over the limit of {limit} bytes")
            out.write(chunk)
        return size


class _Watch:
    """Stops one download at its deadline or its job's cancel, from a thread of its own:
    it shuts down the download's sockets (its own duplicates of them, so a socket that
    TLS wrapped, or that httpx closed, is never touched), which wakes a waiting read."""

    def __init__(self, cancel: threading.Event | None, deadline_s: float) -> None:
        self.cancel = cancel or threading.Event()
        self.deadline_s = deadline_s
        self.ends_at = time.monotonic() + deadline_s
        self.stopped: str | None = None
        """Why it was stopped: `canceled` or `deadline`."""
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._watch, name="fetch-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._done.set()
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            if self._done.is_set():
                return
            own = sock.dup()
            self._sockets.append(own)
            if self.stopped is not None:  # stopped before this connection opened
                with contextlib.suppress(OSError):
                    own.shutdown(socket.SHUT_RDWR)

    def check(self, field: str) -> None:
        """Raise the stop's own error once it was stopped (or is past its deadline)."""
        if self.stopped is None and time.monotonic() >= self.ends_at:
            self.stopped = "deadline"
        if self.stopped is None and self.cancel.is_set():
            self.stopped = "canceled"
        if self.stopped == "canceled":
            raise InputError(field, "was not fetched: the job was canceled")
        if self.stopped == "deadline":
            raise InputError(
                field,
                f"could not be fetched within {self.deadline_s:g} s (net.fetch_deadline_s)",
            )

    def _watch(self) -> None:
        while not self._done.is_set():
            left = self.ends_at - time.monotonic()
            if self.cancel.wait(min(max(left, 0.0), POLL_S)):
                self._stop("canceled")
                return
            if left <= 0:
                self._stop("deadline")
                return

    def _stop(self, why: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.stopped = why
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _local_file(storage: LocalStorage, key: str, field: str) -> Path:
    try:
        path = storage.path_of(key)
        if path.is_file():
            return path
    except NotFound:
        pass
    raise InputError(field, f"no stored file {key!r}")


def _suffix(ref: str) -> str:
    """The extension of a key or URL path, where it looks like one (decoders use it)."""
    suffix = Path(urlsplit(ref).path).suffix
    return suffix if _SUFFIX.match(suffix) else ""
