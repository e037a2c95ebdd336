"""The files service: uploads, downloads and deletes for owners, and the file references
in job inputs (checked at submit, and noted so that a used upload outlives its TTL)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import BinaryIO

import anyio
import redis.asyncio as aredis
from pydantic import BaseModel, JsonValue
from starlette.datastructures import UploadFile

from jobs.errors import InputError, NotFound, TooLarge
from jobs.filerefs import file_ref_fields
from jobs.schemas import schema_for
from jobs.settings import Settings
from jobstore.file_objects import PURPOSES, AsyncFileObjects, FileObject, new_file_id
from jobstore.retention_index import AsyncUploads
from security.echo import clip
from security.netguard import NetPolicy, check_url
from storage.base import (
    Storage,
    StoredObject,
    check_content_type,
    owner_of,
    upload_key,
    validate_key,
)
from storage.refs import parse_ref


class FileInfo(BaseModel):
    key: str
    """Name it in a job's input, or GET /v1/files/{key} with your API key."""
    bytes: int
    content_type: str
    sha256: str | None
    url: str
    """A download URL that needs no API key, valid for `storage.url_ttl_s`."""


class FileService:
    def __init__(self, settings: Settings, storage: Storage, client: aredis.Redis) -> None:
        self.settings = settings
        self.storage = storage
        self.objects = AsyncFileObjects(client)
        self.uploads = AsyncUploads(client)
        self.policy = NetPolicy.from_settings(settings.net)

    async def upload(self, owner: str, upload: UploadFile) -> FileInfo:
        """Store an uploaded file of `owner` under a new key. `TooLarge` over the limit."""
        limit = self.settings.storage.max_upload_bytes
        if upload.size is not None and upload.size > limit:
            raise TooLarge("file", f"is {upload.size} bytes, over the limit of {limit} bytes")
        content_type = check_content_type(upload.content_type, "file.content_type")
        return await self.store(owner, upload.file, upload.filename, content_type)

    async def store(
        self, owner: str, data: BinaryIO, filename: str | None, content_type: str
    ) -> FileInfo:
        """Store `data` as an upload of `owner` under a new key (kept `upload_ttl_s` unless
        a job names it): an uploaded file's, or audio that the API made itself (a voice
        session's turn). `TooLarge` over the limit."""
        limit = self.settings.storage.max_upload_bytes
        key = upload_key(owner, filename)
        # Noted before the write: a crash in between leaves an entry, not an orphan file.
        await self.uploads.note(key, time.time() + self.settings.storage.upload_ttl_s)
        put = partial(self.storage.put, key, data, content_type, max_bytes=limit)
        try:
            info = await anyio.to_thread.run_sync(put)
        except BaseException:
            await self.uploads.drop(key)
            raise
        return await self.describe(info)

    async def describe(self, info: StoredObject) -> FileInfo:
        sign = partial(self.storage.signed_url, info.key, self.settings.storage.url_ttl_s)
        return FileInfo(
            key=info.key,
            bytes=info.size_bytes,
            content_type=info.content_type,
            sha256=info.sha256,
            url=await anyio.to_thread.run_sync(sign),
        )

    async def name_object(
        self, owner: str, info: FileInfo, filename: str, purpose: str
    ) -> FileObject:
        """Record an OpenAI file object (`file-…`) for a stored upload of `owner`."""
        if purpose not in PURPOSES:
            raise InputError("purpose", f"must be one of {list(PURPOSES)}")
        obj = FileObject(
            id=new_file_id(),
            owner=owner,
            key=info.key,
            bytes=info.bytes,
            filename=filename,
            purpose=purpose,
            created_at=time.time(),
        )
        # As long as the upload is kept (the retention sweep deletes it after that).
        await self.objects.save(obj, int(self.settings.storage.upload_ttl_s))
        return obj

    async def get_object(self, owner: str, file_id: str) -> FileObject:
        """`owner`'s file object `file_id`, else `NotFound`."""
        obj = await self.objects.get(file_id)
        if obj is None or obj.owner != owner:
            raise NotFound(f"no file {clip(file_id, 256)}")
        return obj

    async def list_objects(
        self, owner: str, purpose: str | None, limit: int, after: str | None
    ) -> tuple[list[FileObject], bool]:
        """`owner`'s file objects, newest first, after the one named `after`; and whether
        there are more."""
        return await self.objects.page(owner, purpose, limit, after)

    async def delete_object(self, owner: str, file_id: str) -> None:
        obj = await self.get_object(owner, file_id)
        with contextlib.suppress(NotFound):
            await self.delete(obj.key)
        await self.objects.delete(owner, file_id)

    async def read(self, key: str, max_bytes: int) -> bytes:
        """A stored file's bytes; `TooLarge` over `max_bytes`."""
        info, chunks = await self.open(key)
        if info.size_bytes > max_bytes:
            raise TooLarge("input_file_id", f"is {info.size_bytes} bytes, over {max_bytes}")
        return await anyio.to_thread.run_sync(lambda: b"".join(chunks))

    def owned_or_404(self, key: str, owner: str) -> str:
        """`key` if it is valid (else `InputError`) and `owner`'s (else `NotFound`)."""
        validate_key(key)
        if owner_of(key) != owner:
            raise NotFound(f"no file {clip(key, 256)}")
        return key

    def verify_signed(self, key: str, expires: str, signature: str) -> str:
        validate_key(key)
        self.storage.verify_signed(key, expires, signature)
        return key

    async def open(self, key: str) -> tuple[StoredObject, Iterator[bytes]]:
        """The object's info and its content (opened now: `NotFound` is raised here)."""
        info = await anyio.to_thread.run_sync(self.storage.stat, key)
        chunks = await anyio.to_thread.run_sync(self.storage.iter_chunks, key)
        return info, chunks

    async def delete(self, key: str) -> None:
        if not await anyio.to_thread.run_sync(self.storage.delete, key):
            raise NotFound(f"no file {clip(key, 256)}")
        await self.uploads.forget(key)

    async def check_input_refs(
        self,
        owner: str,
        kind: str,
        data: dict[str, JsonValue],
        nested: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """Check every file reference of a job input (its file fields, and the `nested`
        (field, reference) pairs deeper in it); returns the stored keys it names."""
        try:
            fields = file_ref_fields(schema_for(kind, self.settings))
        except KeyError:
            return []  # an unknown kind: the job service says so
        refs = [(name, data.get(name)) for name in fields] + list(nested)
        used: list[str] = []
        for name, value in refs:
            if isinstance(value, str) and value:
                used += await self._check_ref(owner, f"input.{name}", value)
        return used

    async def _check_ref(self, owner: str, field: str, value: str) -> list[str]:
        ref = parse_ref(value, field, owner, self.settings)
        if ref.kind == "url":
            await anyio.to_thread.run_sync(check_url, ref.value, field, self.policy)
            return []
        if not await anyio.to_thread.run_sync(self.storage.exists, ref.value):
            raise InputError(field, f"no stored file {clip(ref.value, 256)}")
        return [ref.value]

    async def note_used(self, used: list[str], job_id: str) -> None:
        """Let each upload in `used` live as long as the job `job_id` does."""
        await self.uploads.note_users(used, job_id)
