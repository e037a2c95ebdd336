"""OpenAI file objects (`file-…`): a name for a stored file that OpenAI's clients use.

`client.files.create(file=…, purpose="batch")` stores the upload as any other (a storage
key of its owner) and records a file object for it in Redis (`keys.file_object`):
`GET /v1/files/{id}` and `/v1/files/{id}/content` find the key through it. A batch's
output and error files get one each.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal, get_args

import redis
import redis.asyncio as aredis
from pydantic import BaseModel

from jobs import keys

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

    def openai(self) -> dict[str, Any]:
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


def _writes(pipe: Any, obj: FileObject, ttl_s: int) -> None:
    pipe.hset(keys.file_object(obj.id), mapping=obj.fields())
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
