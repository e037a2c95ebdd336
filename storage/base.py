"""The storage interface, its object info, and the key rules every backend shares.

A key is a relative, `/`-separated path whose first segment is the owner:
`OWNER/uploads/UPLOAD_ID/NAME` for uploads and `OWNER/jobs/JOB_ID/NAME` for job outputs.
Segments are letters, digits, `.`, `_` and `-`, never empty, never `.` or `..`, never
starting with a dot: no key can name anything outside its backend's root.

Errors are the domain errors of `jobs.errors`: `NotFound` for a missing object,
`InputError` (field `key`) for a key that breaks the rules, `TooLarge` over a size limit,
`Unavailable` when the backend cannot be reached, and `StorageConfigError` (a kind of
`Unavailable`) when it is misconfigured at start-up.
"""

from __future__ import annotations

import hashlib
import io
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from jobs.errors import InputError, NotFound, TooLarge, Unavailable
from storage.signing import SignatureError

CHUNK_BYTES = 1024 * 1024
"""Read and write size of every streamed copy."""
MAX_KEY_CHARS = 512
DEFAULT_CONTENT_TYPE = "application/octet-stream"

SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}"
"""One segment of a key (between slashes): 1-128 letters, digits, `.`, `_` or `-`, not
starting with a dot."""
KEY_PATTERN = rf"^{SEGMENT}(/{SEGMENT})*$"
"""A key as `validate_key` takes it (up to `MAX_KEY_CHARS`): the routes that name a key
publish it."""
_SEGMENT = re.compile(SEGMENT)
_CONTENT_TYPE = re.compile(r"^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+(;[ -~]*)?$")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")

Data = bytes | BinaryIO | Iterable[bytes]
"""What `put` accepts: bytes, a readable binary stream, or an iterable of chunks."""


class StorageConfigError(Unavailable):
    """The backend is misconfigured or unreachable at start-up (missing bucket, no access)."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    size_bytes: int
    content_type: str
    sha256: str | None = None
    """Hex SHA-256 of the content; always set by `put`, None where a backend cannot tell."""
    modified_at: float | None = None


class Storage(ABC):
    """Objects by key. Every method is blocking: call it from a thread in async code."""

    @abstractmethod
    def check(self) -> None:
        """Raise `StorageConfigError` unless the backend is ready to store objects."""

    @abstractmethod
    def put(
        self, key: str, data: Data, content_type: str, *, max_bytes: int | None = None
    ) -> StoredObject:
        """Store `data` under `key` (replacing it), streaming; `TooLarge` over `max_bytes`
        (nothing is left behind then)."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A readable stream of the object; `NotFound` if there is none. Close it."""

    @abstractmethod
    def stat(self, key: str) -> StoredObject:
        """The object's info; `NotFound` if there is none."""

    @abstractmethod
    def delete(self, key: str) -> bool:
        """Delete the object; False if there was none."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under the folder `prefix` (a key); returns how many."""

    @abstractmethod
    def signed_url(self, key: str, ttl_s: int) -> str:
        """A URL that downloads the object without an API key until `ttl_s` from now."""

    def verify_signed(self, key: str, expires: str, signature: str) -> None:
        """Raise `SignatureError` unless this is a valid signed URL of `key` that the API
        serves (the local backend's; other backends presign URLs of their own)."""
        raise SignatureError("signed URLs of this storage backend do not point at the API")

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except NotFound:
            return False
        return True

    def iter_chunks(self, key: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The object's content, chunk by chunk (opened at once: `NotFound` is raised here)."""
        stream = self.open(key)
        return _chunks_then_close(stream, chunk_bytes)


def _chunks_then_close(stream: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    with stream:
        while chunk := stream.read(chunk_bytes):
            yield chunk


def validate_key(key: str, field: str = "key") -> str:
    """Return `key` unchanged, or raise `InputError` naming `field` if it breaks a rule."""
    if not key:
        raise InputError(field, "must not be empty")
    if len(key) > MAX_KEY_CHARS:
        raise InputError(field, f"is longer than {MAX_KEY_CHARS} characters")
    if "\x00" in key or "\\" in key:
        raise InputError(field, "must not contain NUL or backslash characters")
    if key.startswith("/"):
        raise InputError(field, "must be a relative key, not an absolute path")
    for segment in key.split("/"):
        if segment in {"", ".", ".."}:
            raise InputError(field, "must not contain empty, '.' or '..' segments")
        if not _SEGMENT.fullmatch(segment):
            raise InputError(
                field,
                f"segment {segment[:40]!r} must be 1-128 letters, digits, '.', '_' or '-' "
                "and must not start with a dot",
            )
    return key


def owner_of(key: str) -> str:
    """The owner named by a (valid) key's first segment."""
    return key.split("/", 1)[0]


def owner_prefix(owner: str) -> str:
    """The folder (with its trailing `/`) of every key of `owner`."""
    validate_key(owner, "owner")
    if "/" in owner:
        raise InputError("owner", "must be a single segment")
    return f"{owner}/"


def normalise_prefix(prefix: str) -> str:
    """A bucket prefix as `a/b/` (or empty), with the key rules applied."""
    prefix = prefix.strip("/")
    return f"{validate_key(prefix, 'storage.s3.prefix')}/" if prefix else ""


def safe_name(filename: str | None, default: str = "file") -> str:
    """A client's file name reduced to one safe key segment (keeps the extension)."""
    base = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = _UNSAFE_NAME_CHARS.sub("_", base).lstrip("._")[-100:].lstrip("._")
    return cleaned or default


def upload_key(owner: str, filename: str | None = None) -> str:
    """A new, unguessable key for an upload of `owner`."""
    return f"{owner_prefix(owner)}uploads/{secrets.token_hex(16)}/{safe_name(filename)}"


def job_folder(owner: str, job_id: str) -> str:
    """The folder (no trailing `/`) of a job's outputs."""
    return validate_key(f"{owner_prefix(owner)}jobs/{job_id}", "job_id")


def job_key(owner: str, job_id: str, name: str) -> str:
    """The key of output `name` of a job."""
    return validate_key(f"{job_folder(owner, job_id)}/{name}", "name")


def check_content_type(content_type: str | None, field: str = "content_type") -> str:
    """A media type fit to send back as a header; the default when none is given."""
    if not content_type:
        return DEFAULT_CONTENT_TYPE
    if len(content_type) > 200 or not _CONTENT_TYPE.match(content_type):
        raise InputError(field, f"{content_type[:60]!r} is not a media type")
    return content_type


def iter_data(data: Data, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """`put`'s data as chunks of at most `chunk_bytes`."""
    if isinstance(data, bytes | bytearray | memoryview):
        data = io.BytesIO(bytes(data))
    if hasattr(data, "read"):
        reader: BinaryIO = data  # type: ignore[assignment]
        while chunk := reader.read(chunk_bytes):
            yield chunk
        return
    for chunk in data:
        for start in range(0, len(chunk), chunk_bytes):
            yield chunk[start : start + chunk_bytes]


class Digest:
    """Counts and hashes the chunks of a `put`; raises `TooLarge` past `max_bytes`."""

    def __init__(self, max_bytes: int | None) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._sha = hashlib.sha256()

    def add(self, chunk: bytes) -> bytes:
        self.size_bytes += len(chunk)
        if self.max_bytes is not None and self.size_bytes > self.max_bytes:
            raise TooLarge("file", f"is over the limit of {self.max_bytes} bytes")
        self._sha.update(chunk)
        return chunk

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()
