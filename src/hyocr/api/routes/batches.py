"""/v1/batches: OpenAI's Batch API on the jobs layer. A batch reads a JSONL file of requests (a file id, or
an s3:// or gs:// URI) against one endpoint (/v1/chat/completions, /v1/completions or /v1/ocr), each line
through that route's own path below online traffic, and writes OpenAI's output and error files (and, with
``output_uri``, an object per line and a manifest). Another caller's batch is not found (404)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from ...pipeline.objects import refuse_credentials
from ..bodies import batch_body
from ..protocol import BatchCreateRequest, ErrorResponse
from .deps import json_body
from .jobs import jobs_of, owner_of

router = APIRouter(tags=["batch"])
_ERRORS = {400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 415: {"model": ErrorResponse},
           429: {"model": ErrorResponse}}


@router.post("/v1/batches", responses=_ERRORS, summary="Create a batch from an uploaded JSONL file",
             dependencies=[Depends(json_body)])
async def create(body: BatchCreateRequest, request: Request):
    refuse_credentials(body.model_extra)
    expires = body.output_expires_after.model_dump() if body.output_expires_after else None
    batch = await jobs_of(request).batches.create(
        owner_of(request), input_file_id=body.input_file_id, endpoint=body.endpoint,
        completion_window=body.completion_window, metadata=body.metadata, output_uri=body.output_uri,
        output_expires_after=expires)
    return batch_body(batch)


@router.get("/v1/batches", responses=_ERRORS, summary="The caller's batches, newest first")
async def list_batches(request: Request, after: str | None = Query(None, max_length=128),
                       limit: int = Query(20, ge=1, le=100)):
    found, more = await jobs_of(request).batches.list(owner_of(request), limit=limit, after=after)
    data = [batch_body(b) for b in found]
    return {"object": "list", "data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


@router.get("/v1/batches/{batch_id}", responses=_ERRORS, summary="A batch's status and request counts")
async def get_batch(request: Request, batch_id: str):
    return batch_body(await jobs_of(request).batches.get(owner_of(request), batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=_ERRORS,
             summary="Cancel a batch: lines not run get batch_cancelled error lines")
async def cancel(request: Request, batch_id: str):
    jobs = jobs_of(request)
    batch = await jobs.batches.cancel(owner_of(request), batch_id)
    jobs.runner.stop_job(batch.id)  # this replica's lines stop now; others' at their next renewal
    return batch_body(batch)
