"""POST /v1/ocr: the OCR-native API. A multipart upload or a JSON body in; structured pages out."""

from __future__ import annotations

from fastapi import APIRouter, Request

from starlette.exceptions import HTTPException

from ...errors import HyocrError, InvalidRequest, UnsupportedMediaType
from ...pipeline.service import MediaInput
from ..convert import ocr_call
from ..disconnect import unless_disconnected
from ..protocol import ErrorResponse, OcrJsonRequest, OcrResponse
from ..render import ocr_body
from .deps import service_of, settings_of

router = APIRouter(tags=["ocr"])

_FORM_FIELDS = {"task", "fields", "language", "question", "prompt_language", "max_tokens", "temperature", "model"}

_DOC = {
    "requestBody": {
        "content": {
            "application/json": {"schema": OcrJsonRequest.model_json_schema(ref_template="#/components/schemas/{model}")},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "task": {"type": "string", "default": "spotting"},
                        "fields": {"type": "string", "description": "comma-separated, for task=extract"},
                        "language": {"type": "string", "description": "translation target: en | zh"},
                        "question": {"type": "string", "description": "for task=vqa"},
                        "max_tokens": {"type": "integer"},
                    },
                }
            },
        },
        "required": True,
    }
}


async def _parse(request: Request) -> tuple[OcrJsonRequest, list[MediaInput]]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        return OcrJsonRequest.model_validate_json(await request.body()), []
    if content_type == "multipart/form-data":
        settings = settings_of(request)
        try:
            form = await request.form(max_files=settings.max_images_per_request, max_fields=32)
        except HyocrError:
            raise
        except HTTPException as exc:  # Starlette's own multipart limits ("Too many files ...")
            raise InvalidRequest(f"invalid multipart body: {exc.detail}") from None
        except Exception:  # malformed multipart
            raise InvalidRequest("could not parse the multipart body") from None
        uploads: list[MediaInput] = []
        values: dict[str, str] = {}
        for key, value in form.multi_items():
            if hasattr(value, "read"):  # an uploaded file
                if key not in ("file", "files", "image"):
                    raise InvalidRequest(f"unexpected file field {key!r}; use 'file'", param=key)
                uploads.append(MediaInput(await value.read(), param=key))
            elif key in _FORM_FIELDS:
                values[key] = value
            else:
                raise InvalidRequest(f"unknown form field {key!r}", param=key)
        return OcrJsonRequest.model_validate(values), uploads
    raise UnsupportedMediaType(
        "send multipart/form-data (field 'file') or application/json", param="content-type"
    )


@router.post(
    "/v1/ocr",
    response_model=OcrResponse,
    responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 415: {"model": ErrorResponse}},
    openapi_extra=_DOC,
    summary="Recognise text in images: text, boxes in pixels, fields, markdown, per page",
)
async def ocr(request: Request) -> dict:
    body, uploads = await _parse(request)
    call = ocr_call(body, settings_of(request), uploads=uploads)
    return ocr_body(await unless_disconnected(request, service_of(request).ocr(call)))
