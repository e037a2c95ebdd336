"""File routes: upload (multipart, streamed to storage), download, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.datastructures import UploadFile

from api.auth import Owner, current_owner
from api.deps import Files
from api.files import FileInfo
from jobs.errors import InputError

router = APIRouter(prefix="/v1/files", tags=["files"])

UPLOAD_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            }
        },
    }
}
DOWNLOAD_HEADERS = {
    # A stored file is the uploader's content: never let a browser run it on our origin.
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
}


@router.post(
    "",
    status_code=201,
    response_model=FileInfo,
    responses={401: {}, 413: {}, 422: {}},
    openapi_extra=UPLOAD_BODY,
)
async def upload_file(request: Request, owner: Owner, files: Files) -> JSONResponse:
    """Upload a file (multipart field `file`); name its `key` in a job's input.

    Unused, it is deleted after `storage.upload_ttl_s`; used, it lives as long as the jobs
    that used it."""
    # Parsed here, after the API key is checked, not by FastAPI before it.
    form = await request.form(max_files=1, max_fields=16)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InputError("file", "send the file as the multipart/form-data field 'file'")
        info = await files.upload(owner, upload)
    finally:
        await form.close()
    headers = {"Location": f"/v1/files/{info.key}"}
    return JSONResponse(info.model_dump(), status_code=201, headers=headers)


@router.get("/{key:path}", response_class=StreamingResponse, responses={401: {}, 404: {}})
async def download_file(
    request: Request,
    key: str,
    files: Files,
    expires: Annotated[str | None, Query(max_length=20)] = None,
    signature: Annotated[str | None, Query(max_length=128)] = None,
) -> StreamingResponse:
    """Download a file: with a signed URL's `expires` and `signature`, or your API key."""
    if expires is not None or signature is not None:
        files.verify_signed(key, expires or "", signature or "")
    else:
        files.owned_or_404(key, await current_owner(request))
    info, chunks = await files.open(key)
    headers = {**DOWNLOAD_HEADERS, "Content-Length": str(info.size_bytes)}
    return StreamingResponse(chunks, media_type=info.content_type, headers=headers)


@router.delete("/{key:path}", status_code=204, responses={401: {}, 404: {}})
async def delete_file(key: str, owner: Owner, files: Files) -> Response:
    """Delete one of your files."""
    await files.delete(files.owned_or_404(key, owner))
    return Response(status_code=204)
