"""/v1/files: OpenAI's Files API for batch input files (purpose ``batch``) and a batch's output and error
files. Stored in the jobs database; a file belongs to its caller (another gets 404)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.datastructures import UploadFile

from ...errors import InvalidRequest, UnsupportedMediaType
from ..bodies import file_body
from ..multipart import read_form
from ..protocol import ErrorResponse
from .deps import media_type
from .jobs import jobs_of, owner_of

router = APIRouter(tags=["batch"])
_ERRORS = {400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 413: {"model": ErrorResponse},
           429: {"model": ErrorResponse}}
_READ = 1024 * 1024
_DOC = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary", "description": "a JSONL batch input file"},
                   "purpose": {"type": "string", "enum": ["batch"]},
                   "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                   "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2592000}}}}}}}


@router.post("/v1/files", responses=_ERRORS, openapi_extra=_DOC, summary="Upload a batch input file (JSONL)")
async def upload(request: Request):
    if media_type(request) != "multipart/form-data":
        raise UnsupportedMediaType("send multipart/form-data with the fields file and purpose",
                                   param="content-type")
    form = await read_form(request, max_files=1, max_fields=8)
    try:
        given = form.get("file")
        if not isinstance(given, UploadFile):
            raise InvalidRequest("the file field (an uploaded file) is required", param="file")
        purpose = form.get("purpose")
        if not isinstance(purpose, str) or not purpose:
            raise InvalidRequest("purpose is required (batch)", param="purpose")
        record = await jobs_of(request).files.upload(
            owner_of(request), filename=given.filename or "upload.jsonl", purpose=purpose,
            size=given.size or 0, parts=_chunks(given), expires_after=_expires_after(form))
    finally:
        await form.close()  # the spooled upload's temporary file
    return file_body(record)


async def _chunks(upload_file: UploadFile) -> AsyncIterator[bytes]:
    while data := await upload_file.read(_READ):
        yield data


def _expires_after(form) -> int | None:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at" or not isinstance(seconds, str) or not (seconds.isascii() and seconds.isdigit()) \
            or not 3600 <= int(seconds) <= 2_592_000:
        raise InvalidRequest("expires_after needs anchor created_at and seconds 3600 to 2592000",
                             param="expires_after")
    return int(seconds)


@router.get("/v1/files", responses=_ERRORS, summary="The caller's files")
async def list_files(request: Request, after: str | None = Query(None, max_length=128),
                     limit: int = Query(10_000, ge=1, le=10_000),
                     order: str = Query("desc", pattern="^(asc|desc)$"),
                     purpose: str | None = Query(None, max_length=64)):
    found, more = await jobs_of(request).files.list(owner_of(request), limit=limit, after=after, order=order,
                                                    purpose=purpose)
    data = [file_body(f) for f in found]
    return {"object": "list", "data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


@router.get("/v1/files/{file_id}", responses=_ERRORS, summary="A file's object")
async def get_file(request: Request, file_id: str):
    return file_body(await jobs_of(request).files.get(owner_of(request), file_id))


@router.get("/v1/files/{file_id}/content", responses=_ERRORS, summary="A file's bytes")
async def file_content(request: Request, file_id: str):
    files = jobs_of(request).files
    record = await files.get(owner_of(request), file_id)
    return StreamingResponse(files.store.parts(record.id), media_type="application/octet-stream",
                             headers={"Content-Length": str(record.bytes),
                                      "Content-Disposition": f'attachment; filename="{record.id}.jsonl"'})


@router.delete("/v1/files/{file_id}", responses=_ERRORS, summary="Delete a file")
async def delete_file(request: Request, file_id: str):
    await jobs_of(request).files.delete(owner_of(request), file_id)
    return {"id": file_id, "object": "file", "deleted": True}
