"""File routes: upload (multipart, streamed to storage), download, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import UploadFile

from api.auth import Owner, current_owner
from api.deps import Files
from api.file_service import FileInfo, FileService
from api.forms import multipart_body
from api.openai import answers
from api.openai.batch_models import FileDeleted, FileList, OpenAIFile, UploadedFile
from api.openai.protocol import Responses
from jobs.errors import InputError
from jobs.schemas import validation_error_field
from jobstore.file_objects import Purpose, is_file_id
from storage.base import KEY_PATTERN, MAX_KEY_CHARS, SEGMENT

router = APIRouter(prefix="/v1/files", tags=["files"])


class UploadForm(BaseModel):
    """The text fields of an upload (the file is the part `file`); others are ignored."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    purpose: Purpose | None = None
    """OpenAI's `files.create`: the answer is also an OpenAI file object (`batch`: a
    batch's input)."""


UPLOAD_BODY = multipart_body(
    UploadForm,
    {
        "file": "The file, at most `storage.max_upload_bytes` (a deployment setting; 413 "
        "above), stored with its part's content type (`application/octet-stream` where it "
        "has none)."
    },
)
# The key rules are `storage.base.validate_key`'s, which checks them with messages that
# say which rule a key breaks: published here, not checked twice.
Key = Annotated[
    str,
    Path(
        description="A storage key of yours (`FileInfo.key`), or an OpenAI file id.",
        json_schema_extra={"pattern": KEY_PATTERN, "maxLength": MAX_KEY_CHARS},
    ),
]
FileId = Annotated[
    str,
    Path(
        description="An OpenAI file id (`file-…`); a storage key is taken too.",
        json_schema_extra={"pattern": f"^{SEGMENT}$"},
    ),
]
DOWNLOAD: Responses = {
    200: {
        "description": "The file's bytes, with the content type it was stored with.",
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
    },
    401: {},
    404: {},
}
DOWNLOAD_HEADERS = {
    # A stored file is the uploader's content: never let a browser run it on our origin.
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


@router.post(
    "",
    status_code=201,
    response_model=UploadedFile | FileInfo,
    responses={401: {}, 413: {}, 422: {}},
    openapi_extra=UPLOAD_BODY,
)
async def upload_file(request: Request, owner: Owner, files: Files) -> JSONResponse:
    """Upload a file (multipart field `file`); name its `key` in a job's input.

    With a `purpose` field (OpenAI's `files.create`: `batch` for a batch's input), the
    answer is also an OpenAI file object: its `id` (`file-…`) names it on the OpenAI
    routes. Unused, it is deleted after `storage.upload_ttl_s`; used, it lives as long as
    the jobs that used it."""
    # Parsed here, after the API key is checked, not by FastAPI before it.
    form = await request.form(max_files=1, max_fields=16)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InputError("file", "send the file as the multipart/form-data field 'file'")
        purpose = form.get("purpose")
        if purpose is not None and not isinstance(purpose, str):
            raise InputError("purpose", "must be a text field")
        try:
            fields = UploadForm.model_validate({"purpose": purpose})
        except ValidationError as exc:
            raise validation_error_field(exc, "") from None
        info = await files.upload(owner, upload)
        body = info.model_dump()
        if fields.purpose is not None:
            obj = await files.name_object(owner, info, upload.filename or "file", fields.purpose)
            body = obj.openai() | body
    finally:
        await form.close()
    headers = {"Location": f"/v1/files/{body.get('id', info.key)}"}
    return JSONResponse(body, status_code=201, headers=headers)


@router.get("", response_model=FileList, responses={401: {}})
async def list_files(
    owner: Owner,
    files: Files,
    purpose: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: Annotated[str | None, Query(max_length=64)] = None,
) -> FileList:
    """Your OpenAI file objects, newest first (OpenAI's `files.list`)."""
    found, more = await files.list_objects(owner, purpose, limit, after)
    return FileList.model_validate(answers.page([obj.openai() for obj in found], more))


@router.get("/{file_id}/content", response_class=StreamingResponse, responses=DOWNLOAD)
async def file_content(
    request: Request,
    file_id: FileId,
    files: Files,
    expires: Annotated[str | None, Query(max_length=20)] = None,
    signature: Annotated[str | None, Query(max_length=128)] = None,
) -> StreamingResponse:
    """An OpenAI file object's content (OpenAI's `files.content`)."""
    if not is_file_id(file_id):  # a storage key that ends in /content
        return await download_file(request, f"{file_id}/content", files, expires, signature)
    obj = await files.get_object(await current_owner(request), file_id)
    return await _stream(files, obj.key)


FILE_OBJECT: Responses = {
    200: {
        "model": OpenAIFile,
        "description": "The OpenAI file object; for a storage key, the file's bytes.",
        "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
    },
    401: {},
    404: {},
}


@router.get("/{file_id}", responses=FILE_OBJECT)
async def file_object(
    request: Request,
    file_id: FileId,
    files: Files,
    expires: Annotated[str | None, Query(max_length=20)] = None,
    signature: Annotated[str | None, Query(max_length=128)] = None,
) -> Response:
    """An OpenAI file object (OpenAI's `files.retrieve`)."""
    if not is_file_id(file_id):
        return await download_file(request, file_id, files, expires, signature)
    obj = await files.get_object(await current_owner(request), file_id)
    return JSONResponse(obj.openai())


@router.get("/{key:path}", response_class=StreamingResponse, responses=DOWNLOAD)
async def download_file(
    request: Request,
    key: Key,
    files: Files,
    expires: Annotated[str | None, Query(max_length=20)] = None,
    signature: Annotated[str | None, Query(max_length=128)] = None,
) -> StreamingResponse:
    """Download a file: with a signed URL's `expires` and `signature`, or your API key."""
    if expires is not None or signature is not None:
        files.verify_signed(key, expires or "", signature or "")
    else:
        files.owned_or_404(key, await current_owner(request))
    return await _stream(files, key)


async def _stream(files: FileService, key: str) -> StreamingResponse:
    info, chunks = await files.open(key)
    headers = {**DOWNLOAD_HEADERS, "Content-Length": str(info.size_bytes)}
    return StreamingResponse(chunks, media_type=info.content_type, headers=headers)


@router.delete(
    "/{key:path}",
    status_code=204,
    responses={
        200: {"model": FileDeleted, "description": "A file object deleted"},
        401: {},
        404: {},
    },
)
async def delete_file(key: Key, owner: Owner, files: Files) -> Response:
    """Delete one of your files: by its storage key (204), or by its OpenAI file id
    (OpenAI's `files.delete`: 200 with the deleted object)."""
    if is_file_id(key):
        await files.delete_object(owner, key)
        return JSONResponse({"id": key, "object": "file", "deleted": True})
    await files.delete(files.owned_or_404(key, owner))
    return Response(status_code=204)
