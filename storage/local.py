"""The local backend: objects as files under `data_dir/storage/objects`.

Each object is written to a temp file in the same file system and renamed into place,
so a reader never sees half a file. Its content type and SHA-256 live beside it in a
parallel tree, `meta/KEY.json`. Paths are built from validated keys only, and a path
that passes through a symlink is treated as missing: nothing outside the root is read.
"""

from __future__ import annotations

import contextlib
import json
import mimetypes
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from jobs.errors import InputError, NotFound
from storage.base import (
    Data,
    Digest,
    Storage,
    StorageConfigError,
    StoredObject,
    check_content_type,
    iter_data,
    validate_key,
)
from storage.signing import Signer

STALE_TMP_S = 24 * 3600
"""A temp file this old is a leftover of a crashed write (cleaned when the API starts)."""


class LocalStorage(Storage):
    def __init__(self, root: Path, signer: Signer, base_url: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.objects = self.root / "objects"
        self.meta = self.root / "meta"
        self.tmp = self.root / "tmp"
        self.signer = signer
        self.base_url = base_url.rstrip("/")

    def check(self) -> None:
        try:
            for folder in (self.objects, self.meta, self.tmp):
                folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.tmp) as probe:
                probe.write(b"ok")
        except OSError as exc:
            raise StorageConfigError(f"storage: cannot write under {self.root}: {exc}") from exc
        self._clean_tmp(time.time() - STALE_TMP_S)

    def _clean_tmp(self, before: float) -> None:
        """Remove temp files that a crashed write left behind."""
        for leftover in self.tmp.iterdir():
            with contextlib.suppress(OSError):
                if leftover.lstat().st_mtime < before:
                    leftover.unlink()

    def path_of(self, key: str) -> Path:
        """The file of `key`, refused (`NotFound`) where a symlink lies on the way."""
        return self._path(self.objects, key)

    def put(
        self, key: str, data: Data, content_type: str, *, max_bytes: int | None = None
    ) -> StoredObject:
        path = self.path_of(key)
        content_type = check_content_type(content_type)
        digest = Digest(max_bytes)
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in iter_data(data):
                    out.write(digest.add(chunk))
                out.flush()
                os.fsync(out.fileno())
            _move_into_place(Path(tmp_name), path, key)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        info = StoredObject(key, digest.size_bytes, content_type, digest.sha256, time.time())
        self._write_meta(info)
        return info

    def open(self, key: str) -> BinaryIO:
        path = self.path_of(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            raise NotFound(f"no file {key!r}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotFound(f"no file {key!r}")
        return os.fdopen(fd, "rb")

    def stat(self, key: str) -> StoredObject:
        path = self.path_of(key)
        try:
            st = path.lstat()
        except OSError:
            raise NotFound(f"no file {key!r}") from None
        if not stat.S_ISREG(st.st_mode):
            raise NotFound(f"no file {key!r}")
        meta = self._read_meta(key)
        sha256 = meta.get("sha256") if meta.get("size_bytes") == st.st_size else None
        sha256 = sha256 if isinstance(sha256, str) else None
        content_type = meta.get("content_type") or _guess_type(key)
        return StoredObject(key, st.st_size, str(content_type), sha256, st.st_mtime)

    def delete(self, key: str) -> bool:
        try:
            path = self.path_of(key)
            path.unlink()
        except (NotFound, FileNotFoundError, IsADirectoryError):
            return False
        self._path(self.meta, key, ".json").unlink(missing_ok=True)
        self._prune(path.parent, self.objects)
        self._prune(self._path(self.meta, key, ".json").parent, self.meta)
        return True

    def delete_prefix(self, prefix: str) -> int:
        prefix = validate_key(prefix.rstrip("/"), "prefix")
        try:
            folder = self.path_of(prefix)
        except NotFound:
            return 0
        if not folder.is_dir():
            return 0
        count = sum(len(files) for _, _, files in os.walk(folder))
        shutil.rmtree(folder, ignore_errors=True)
        meta_folder = self._path(self.meta, prefix)
        if meta_folder.is_dir() and not meta_folder.is_symlink():
            shutil.rmtree(meta_folder, ignore_errors=True)
        self._prune(folder.parent, self.objects)
        self._prune(meta_folder.parent, self.meta)
        return count

    def signed_url(self, key: str, ttl_s: int) -> str:
        return self.signer.url(self.base_url, validate_key(key), ttl_s)

    def verify_signed(self, key: str, expires: str, signature: str) -> None:
        self.signer.verify(validate_key(key), expires, signature)

    def _path(self, tree: Path, key: str, suffix: str = "") -> Path:
        path = tree / (validate_key(key) + suffix)
        if os.path.realpath(path) != str(path):
            raise NotFound(f"no file {key!r}")
        return path

    def _write_meta(self, info: StoredObject) -> None:
        path = self._path(self.meta, info.key, ".json")
        body = {
            "content_type": info.content_type,
            "sha256": info.sha256,
            "size_bytes": info.size_bytes,
        }
        fd, tmp_name = tempfile.mkstemp(dir=self.tmp)
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        try:
            _move_into_place(Path(tmp_name), path, info.key)
        finally:
            Path(tmp_name).unlink(missing_ok=True)

    def _read_meta(self, key: str) -> dict[str, object]:
        try:
            meta = json.loads(self._path(self.meta, key, ".json").read_bytes())
        except (OSError, ValueError, NotFound):
            return {}
        return meta if isinstance(meta, dict) else {}

    @staticmethod
    def _prune(folder: Path, top: Path) -> None:
        """Remove empty folders from `folder` up to (not including) `top`."""
        while folder != top and top in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent


def _move_into_place(tmp: Path, path: Path, key: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    except (NotADirectoryError, IsADirectoryError, FileExistsError) as exc:
        raise InputError("key", f"{key!r} conflicts with an existing file or folder") from exc


def _guess_type(key: str) -> str:
    return mimetypes.guess_type(key)[0] or "application/octet-stream"
