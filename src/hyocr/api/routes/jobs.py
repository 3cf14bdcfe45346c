"""/v1/jobs: documents read in the background, stored, and fetched when done (202 + polling, webhooks).

POST takes what /v1/ocr takes; the job belongs to the caller (API key or JWT subject): another caller gets
404. An Idempotency-Key makes a retried submit return the same job. ``image`` may be an object URI
(s3://, gs://) and ``output_uri`` a prefix the result is written to, where the server allows those buckets.
"""

from __future__ import annotations

import copy
import json

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ...errors import InvalidRequest
from ...jobs.service import Callback, Jobs
from ...pipeline.objects import refuse_credentials
from ..bodies import job_body, job_page_body, ocr_body
from ..convert import ocr_call
from ..protocol import ErrorResponse, JobJsonRequest
from .deps import caller_of, settings_of
from .ocr import _DOC, _FORM_FIELDS, read_body

router = APIRouter(tags=["jobs"])
_ERRORS = {400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}}
_JOB_FORM_FIELDS = (_FORM_FIELDS - {"stream"}) | {"callback_url", "output_uri"}
_JSON_LINES = "application/x-ndjson"
# OpenAPI: what /v1/ocr takes, and the job's own fields (a webhook, an output URI); no stream
_JOB_DOC = copy.deepcopy(_DOC)
_JOB_DOC["requestBody"]["content"]["application/json"]["schema"] = JobJsonRequest.model_json_schema(
    ref_template="#/components/schemas/{model}")
_JOB_FORM = _JOB_DOC["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
_JOB_FORM.pop("stream", None)
_JOB_FORM.update(callback_url={"type": "string", "description": "POSTed (signed) when the job ends"},
                 callback_headers={"type": "string", "description": "JSON object: headers sent with the webhook"},
                 output_uri={"type": "string", "description": "s3:// or gs:// prefix the result is written to"})
# Integer query parameters are bounded here, before the database sees them (SQLite's integers are 64-bit:
# 2**63 would be an OverflowError). 2**53 - 1: the largest integer a JavaScript client holds exactly.
MAX_SEQ = 2**53 - 1


def jobs_of(request: Request) -> Jobs:
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise InvalidRequest("the jobs API is off on this server (HYOCR_JOBS=false)", code="jobs_disabled")
    return jobs


def owner_of(request: Request) -> str:
    """Who owns what this request makes or reads: the gateway's principal, or everyone when auth is off."""
    return caller_of(request) or "anonymous"


@router.post("/v1/jobs", status_code=202, responses=_ERRORS, openapi_extra=_JOB_DOC,
             summary="Submit images or a PDF to read in the background; poll the job or get a webhook")
async def submit(request: Request):
    body, uploads = await read_body(request, JobJsonRequest, _JOB_FORM_FIELDS)
    if body.stream:
        raise InvalidRequest("a job is not streamed: poll GET /v1/jobs/{id}/pages for pages as they finish",
                             param="stream")
    key = request.headers.get("idempotency-key")
    if key is not None and not 1 <= len(key) <= 256:
        raise InvalidRequest("Idempotency-Key must be 1 to 256 characters", param="Idempotency-Key")
    refuse_credentials(body.model_extra)
    callback = Callback(body.callback_url, body.callback_headers) if body.callback_url else None
    call = ocr_call(body, settings_of(request), uploads=uploads)
    job, created = await jobs_of(request).submit(owner_of(request), call, idempotency_key=key,
                                                 callback=callback, output_uri=body.output_uri)
    return JSONResponse(job_body(job), status_code=202 if created else 200,
                        headers={"Location": f"/v1/jobs/{job.id}", "Retry-After": "1"})


@router.get("/v1/jobs", responses=_ERRORS, summary="The caller's jobs, newest first")
async def list_jobs(request: Request, limit: int = Query(20, ge=1, le=100),
                    after: str | None = Query(None, max_length=128)):
    found, more = await jobs_of(request).list(owner_of(request), limit=limit, after=after)
    return {"object": "list", "data": [job_body(j) for j in found], "has_more": more,
            "last_id": found[-1].id if found else None}


@router.get("/v1/jobs/{job_id}", responses=_ERRORS, summary="A job's status and progress")
async def get_job(request: Request, job_id: str):
    job = await jobs_of(request).get(owner_of(request), job_id)
    headers = None if job.finished else {"Retry-After": "1"}
    return JSONResponse(job_body(job), headers=headers)


@router.get("/v1/jobs/{job_id}/result", responses=_ERRORS, summary="The /v1/ocr result of a succeeded job")
async def job_result(request: Request, job_id: str):
    return ocr_body(await jobs_of(request).result(owner_of(request), job_id))


@router.get("/v1/jobs/{job_id}/pages", responses=_ERRORS,
            summary="Pages stored so far, in the order they finished (JSON, or JSON lines)")
async def job_pages(request: Request, job_id: str, after: int = Query(0, ge=0, le=MAX_SEQ),
                    limit: int = Query(100, ge=1, le=1000)):
    found, more = await jobs_of(request).pages(owner_of(request), job_id, after=after, limit=limit)
    data = [job_page_body(seq, position, page) for seq, position, page in found]
    if _JSON_LINES in request.headers.get("accept", ""):
        lines = (json.dumps(item, ensure_ascii=False) + "\n" for item in data)
        return StreamingResponse(lines, media_type=_JSON_LINES, headers={"X-Has-More": str(more).lower()})
    return {"object": "list", "data": data, "has_more": more, "last_seq": data[-1]["seq"] if data else after}


@router.delete("/v1/jobs/{job_id}", responses=_ERRORS,
               summary="Cancel an active job (its engine work stops), or delete a finished one")
async def delete_job(request: Request, job_id: str):
    cancelled = await jobs_of(request).cancel_or_delete(owner_of(request), job_id)
    if cancelled is not None:
        return job_body(cancelled)
    return {"id": job_id, "object": "ocr.job.deleted", "deleted": True}


@router.post("/v1/jobs/{job_id}/cancel", responses=_ERRORS,
             summary="Cancel an active job (its engine work stops); a finished job is answered as it is")
async def cancel_job(request: Request, job_id: str):
    return job_body(await jobs_of(request).cancel(owner_of(request), job_id))


@router.get("/v1/webhooks/secret", responses=_ERRORS,
            summary="The secret your webhook receivers verify with (Standard Webhooks, whsec_...): yours alone")
async def webhook_secret(request: Request):
    return {"object": "webhook_secret", "secret": jobs_of(request).webhook_secret(owner_of(request))}
