"""OpenAI file objects (`file-…`): a name for a stored file that OpenAI's clients use.

`client.files.create(file=…, purpose="batch")` stores the upload as any other (a storage
key of its owner) and records a file object for it in Redis (`keys.file_object`):
`GET /v1/files/{id}` and `/v1/files/{id}/content` find the key through it. A batch's
output and error files get one each. Each owner's file objects are indexed by creation
time (`keys.owner_files`). `AsyncFileObjects` is the API's; the scheduler saves a batch's
files with `save_object_sync`.
"""

from __future__ import annotations

import re
import secrets
from typing import Literal, TypedDict, get_args

import redis
import redis.asyncio as aredis
from pydantic import BaseModel
from redis.asyncio.client import Pipeline as AsyncPipeline
from redis.client import Pipeline

from jobs import keys
from jobstore.codec import flat_pairs, text_list, text_map

Purpose = Literal[
    "batch", "batch_output", "assistants", "fine-tune", "vision", "user_data", "evals"
]
"""What OpenAI's `purpose` may say; mmq reads only `batch` files, and stores the others."""
PURPOSES: tuple[str, ...] = get_args(Purpose)
_ID = re.compile(r"^file-[0-9a-f]{24}$")


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def is_file_id(value: str) -> bool:
    return _ID.match(value) is not None


class OpenAIFileFields(TypedDict):
    """OpenAI's file object, with mmq's storage `key` beside it."""

    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"]
    status_details: None
    key: str


class FileObject(BaseModel):
    id: str
    owner: str
    key: str
    """The storage key (mmq's own name for the file)."""
    bytes: int
    filename: str
    purpose: str
    created_at: float

    def fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.model_dump().items()}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> FileObject:
        return cls.model_validate(fields)

    def openai(self) -> OpenAIFileFields:
        """OpenAI's file object, with mmq's storage `key` beside it."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": int(self.created_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "key": self.key,
        }


def _writes(pipe: Pipeline | AsyncPipeline, obj: FileObject, ttl_s: int) -> None:
    pipe.hset(keys.file_object(obj.id), items=flat_pairs(obj.fields()))
    pipe.expire(keys.file_object(obj.id), ttl_s)
    pipe.zadd(keys.owner_files(obj.owner), {obj.id: obj.created_at})


async def save_object(client: aredis.Redis, obj: FileObject, ttl_s: int) -> None:
    """Record `obj` for `ttl_s` (as long as the file is kept: an upload's or output's)."""
    pipe = client.pipeline(transaction=True)
    _writes(pipe, obj, ttl_s)
    await pipe.execute()


def save_object_sync(client: redis.Redis, obj: FileObject, ttl_s: int) -> None:
    pipe = client.pipeline(transaction=True)
    _writes(pipe, obj, ttl_s)
    pipe.execute()


class AsyncFileObjects:
    LIST_READ = 100
    """File ids read from an owner's index at a time while a page is gathered."""

    def __init__(self, client: aredis.Redis) -> None:
        self.r = client

    async def save(self, obj: FileObject, ttl_s: int) -> None:
        """Record `obj` for `ttl_s` (as long as the file is kept)."""
        await save_object(self.r, obj, ttl_s)

    async def get(self, file_id: str) -> FileObject | None:
        fields = text_map(await self.r.hgetall(keys.file_object(file_id)))
        return FileObject.from_fields(fields) if fields else None

    async def page(
        self, owner: str, purpose: str | None, limit: int, after: str | None
    ) -> tuple[list[FileObject], bool]:
        """`owner`'s file objects (of `purpose`, if given), newest first, after the one
        named `after`; and whether there are more. Ids whose object expired are skipped."""
        index = keys.owner_files(owner)
        start = 0
        if after is not None:
            rank = await self.r.zrevrank(index, after)
            start = rank + 1 if isinstance(rank, int) else 0
        found: list[FileObject] = []
        more = False
        while len(found) <= limit:
            ids = text_list(await self.r.zrevrange(index, start, start + self.LIST_READ - 1))
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

    async def delete(self, owner: str, file_id: str) -> None:
        """Forget `owner`'s file object `file_id` (not its file)."""
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(keys.file_object(file_id))
        pipe.zrem(keys.owner_files(owner), file_id)
        await pipe.execute()
