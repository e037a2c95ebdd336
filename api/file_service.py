"""The files service: uploads, downloads and deletes for owners, and the file references
in job inputs (checked at submit, and noted so that a used upload outlives its TTL)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import anyio
import redis.asyncio as aredis
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from jobs import keys
from jobs.errors import InputError, NotFound, TooLarge
from jobs.filerefs import file_ref_fields
from jobs.schemas import schema_for
from jobs.settings import Settings
from jobstore.codec import text_list, text_map
from jobstore.file_objects import PURPOSES, FileObject, new_file_id, save_object
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
        self.r = client
        self.policy = NetPolicy.from_settings(settings.net)

    async def upload(self, owner: str, upload: UploadFile) -> FileInfo:
        """Store an uploaded file of `owner` under a new key. `TooLarge` over the limit."""
        limit = self.settings.storage.max_upload_bytes
        if upload.size is not None and upload.size > limit:
            raise TooLarge("file", f"is {upload.size} bytes, over the limit of {limit} bytes")
        content_type = check_content_type(upload.content_type, "file.content_type")
        key = upload_key(owner, upload.filename)
        # Noted before the write: a crash in between leaves an entry, not an orphan file.
        await self.r.zadd(keys.UPLOADS, {key: time.time() + self.settings.storage.upload_ttl_s})
        put = partial(self.storage.put, key, upload.file, content_type, max_bytes=limit)
        try:
            info = await anyio.to_thread.run_sync(put)
        except BaseException:
            await self.r.zrem(keys.UPLOADS, key)
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
        await save_object(self.r, obj, int(self.settings.storage.upload_ttl_s))
        return obj

    async def get_object(self, owner: str, file_id: str) -> FileObject:
        """`owner`'s file object `file_id`, else `NotFound`."""
        fields = text_map(await self.r.hgetall(keys.file_object(file_id)))
        if not fields or fields.get("owner") != owner:
            raise NotFound(f"no file {file_id!r}")
        return FileObject.from_fields(fields)

    async def list_objects(
        self, owner: str, purpose: str | None, limit: int, after: str | None
    ) -> tuple[list[FileObject], bool]:
        """`owner`'s file objects, newest first, after the one named `after`; and whether
        there are more."""
        index = keys.owner_files(owner)
        start = 0
        if after is not None:
            rank = await self.r.zrevrank(index, after)
            start = rank + 1 if isinstance(rank, int) else 0
        found: list[FileObject] = []
        more = False
        while len(found) <= limit:
            ids = text_list(await self.r.zrevrange(index, start, start + 99))
            if not ids:
                break
            start += len(ids)
            pipe = self.r.pipeline(transaction=False)
            for file_id in ids:
                pipe.hgetall(keys.file_object(file_id))
            for raw in await pipe.execute():
                fields = text_map(raw)
                if fields and (purpose is None or fields.get("purpose") == purpose):
                    found.append(FileObject.from_fields(fields))
        if len(found) > limit:
            found, more = found[:limit], True
        return found, more

    async def delete_object(self, owner: str, file_id: str) -> None:
        obj = await self.get_object(owner, file_id)
        with contextlib.suppress(NotFound):
            await self.delete(obj.key)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(keys.file_object(file_id))
        pipe.zrem(keys.owner_files(owner), file_id)
        await pipe.execute()

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
            raise NotFound(f"no file {key!r}")
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
            raise NotFound(f"no file {key!r}")
        pipe = self.r.pipeline(transaction=True)
        pipe.zrem(keys.UPLOADS, key)
        pipe.delete(keys.upload_jobs(key))
        await pipe.execute()

    async def check_input_refs(
        self,
        owner: str,
        kind: str,
        data: dict[str, Any],
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
            raise InputError(field, f"no stored file {ref.value!r}")
        return [ref.value]

    async def note_used(self, used: list[str], job_id: str) -> None:
        """Let each upload in `used` live as long as the job `job_id` does."""
        if not used:
            return
        pipe = self.r.pipeline(transaction=False)
        for key in used:
            pipe.zscore(keys.UPLOADS, key)
        scores = await pipe.execute()
        for key, score in zip(used, scores, strict=True):
            if score is not None:
                await self.r.sadd(keys.upload_jobs(key), job_id)
