"""POST /v1/ocr: the OCR-native API. A multipart upload or a JSON body in; structured pages out.

An image or a PDF (rendered server-side, ``pages`` to choose some); ``stream=true`` answers with
server-sent events, one per page as it finishes, then the whole result.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ...errors import HyocrError, InvalidRequest, UnsupportedMediaType
from ...observability.logs import record
from ...pipeline.service import result_of
from ...types import MediaInput, PageRead, Prepared, ReadDone, ReadEvent
from ..bodies import ocr_body, page_body, sse
from ..convert import ocr_call
from ..disconnect import unless_disconnected
from ..errors import hyocr_error_body
from ..multipart import read_form
from ..protocol import ErrorResponse, OcrJsonRequest, OcrResponse
from .deps import caller_of, media_type, service_of, settings_of

router = APIRouter(tags=["ocr"])

_FORM_FIELDS = frozenset({"task", "fields", "schema", "language", "question", "prompt_language", "max_tokens",
                          "temperature", "model", "pages", "prefer_text_layer", "stream"})
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

_DOC = {
    "requestBody": {
        "content": {
            "application/json": {"schema": OcrJsonRequest.model_json_schema(ref_template="#/components/schemas/{model}")},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "an image or a PDF"},
                        "task": {"type": "string", "default": "spotting"},
                        "fields": {"type": "string", "description": "comma-separated, for task=extract"},
                        "schema": {"type": "string", "description": "task=extract: a JSON Schema (JSON text)"},
                        "language": {"type": "string", "description": "translation target: en | zh"},
                        "question": {"type": "string", "description": "for task=vqa"},
                        "max_tokens": {"type": "integer"},
                        "pages": {"type": "string", "description": "PDF pages, 1-based: 2-5,8 (default all)"},
                        "prefer_text_layer": {"type": "boolean", "description": "task text: a PDF page's own "
                                              "text when reliable"},
                        "stream": {"type": "boolean", "description": "server-sent events, one per page"},
                    },
                }
            },
        },
        "required": True,
    }
}


async def read_body(request: Request, model: type[OcrJsonRequest] = OcrJsonRequest,
                    form_fields: frozenset[str] = _FORM_FIELDS) -> tuple[OcrJsonRequest, list[MediaInput]]:
    """The /v1/ocr request (and the jobs API's, which takes the same): JSON, or a multipart upload whose
    form fields validate into the same model."""
    content_type = media_type(request)
    if content_type == "application/json":
        return model.model_validate_json(await request.body()), []
    if content_type == "multipart/form-data":
        form = await read_form(request, max_files=settings_of(request).max_images_per_request, max_fields=32)
        files: list[tuple[str, bytes]] = []
        values: dict[str, Any] = {}
        for key, value in form.multi_items():
            if hasattr(value, "read"):  # an uploaded file
                if key not in ("file", "files", "image"):
                    raise InvalidRequest(f"unexpected file field {key!r}; use 'file'", param=key)
                files.append((key, await value.read()))
            elif key in model.form_json:
                values[key] = _json_field(key, value)
            elif key in form_fields:
                values[key] = value
            else:
                raise InvalidRequest(f"unknown form field {key!r}", param=key)
        # Several files are pages in the order sent; an error names which one (files.1), as images.1 in JSON.
        uploads = [MediaInput(data, param=key if len(files) == 1 else f"{key}.{n}")
                   for n, (key, data) in enumerate(files)]
        return model.model_validate(values, context={"form": True}), uploads  # text fields: numbers as text
    raise UnsupportedMediaType(
        "send multipart/form-data (field 'file') or application/json", param="content-type"
    )


def _json_field(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's depth
        raise InvalidRequest(f"{key}: expected JSON text (an object)", param=key) from None


@router.post(
    "/v1/ocr",
    response_model=OcrResponse,
    responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 415: {"model": ErrorResponse},
               422: {"model": ErrorResponse}},
    openapi_extra=_DOC,
    summary="Recognise text in images and PDFs: text, boxes in pixels, fields, markdown, per page",
)
async def ocr(request: Request):
    body, uploads = await read_body(request)
    call = ocr_call(body, settings_of(request), uploads=uploads)
    events = service_of(request).read(call, caller=caller_of(request))
    if not body.stream:
        return ocr_body(await unless_disconnected(request, result_of(events)))
    try:
        started = await unless_disconnected(request, anext(events))  # admitted and prepared: errors are HTTP's
    except BaseException:
        await events.aclose()
        raise
    return StreamingResponse(_events(started.prep, events), media_type="text/event-stream", headers=_SSE_HEADERS)


async def _events(prep: Prepared, events: AsyncIterator[ReadEvent]) -> AsyncIterator[bytes]:
    """Pages as they finish (``ocr.page``), the whole result (``ocr.result``), ``[DONE]``. A failure
    after the first event is an error event (the status line has gone)."""
    try:
        async for event in events:
            if isinstance(event, ReadDone):
                yield sse(ocr_body(event.result))
            elif isinstance(event, PageRead):
                yield sse({"id": prep.request_id, "object": "ocr.page", "page": page_body(event.page),
                           "completed": event.completed, "total": event.total})
    except HyocrError as exc:
        record(stream_error=exc.code or type(exc).__name__)  # the access line says 200: the status line had gone
        yield sse(hyocr_error_body(exc, prep.request_id)[1])
    finally:
        await events.aclose()  # a client gone: the pages still running are cancelled now
    yield sse("[DONE]")
