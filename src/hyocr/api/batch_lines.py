"""A batch line through its online route's own path: the route's wire model and conversion, the service, the
route's body, at the jobs' BACKGROUND priority. The jobs layer runs batches but does not import the api
layer; ``build_app`` hands it an ``answer_line`` instead, as it hands it ``job_body``.

Whatever a line holds, the answer is an HTTP status and a body: a body the model refuses gets the 400 the
route would give (its message, its param), an engine failure the route's error body, never an exception.
Object URIs (``s3://``, ``gs://``) are taken wherever an image goes (``image``, ``images``, an
``image_url``), read under OBJECT_STORE_ALLOWED_BUCKETS; http(s) URLs are image URLs, fetched under the
image-URL rules by the service itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import replace

from pydantic import ValidationError

from ..errors import HyocrError, InvalidRequest
from ..jobs.batch_runner import Answered
from ..jobs.runner import BACKGROUND
from ..pipeline.objects import ObjectStore, refuse_credentials
from ..pipeline.service import OcrService, result_of
from ..types import ChatDone, Started
from .bodies import completion_body, ocr_body
from .convert import chat_call, completion_call, ocr_call
from .errors import error_body, hyocr_error_body, internal_message, validation_code, validation_message
from .protocol import ChatCompletionRequest, CompletionRequest, OcrJsonRequest

log = logging.getLogger("hyocr.api")
_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
           "/v1/ocr": OcrJsonRequest}
_ID_PREFIX = {"/v1/chat/completions": "chatcmpl", "/v1/completions": "cmpl", "/v1/ocr": "ocr"}


class LineAnswerer:
    def __init__(self, service: OcrService, settings, objects: ObjectStore | None = None) -> None:
        self.service = service
        self.settings = settings
        self.objects = objects or ObjectStore.from_settings(settings)
        limits = service.inputs.limits
        self.max_object_bytes = max(limits.max_image_bytes, limits.max_pdf_bytes)

    async def __call__(self, endpoint: str, request: bytes) -> Answered:
        request_id = f"{_ID_PREFIX[endpoint]}-{uuid.uuid4().hex}"
        try:
            return await self._answer(endpoint, request, request_id)
        except ValidationError as exc:
            message, param = validation_message(exc.errors())
            return Answered(400, error_body(message, "invalid_request_error", param, validation_code(exc.errors())),
                            request_id)
        except HyocrError as exc:
            status, body = hyocr_error_body(exc, request_id)
            return Answered(status, body, request_id)
        except Exception:  # what the route's last resort would answer: a 500 with the request id, logged
            log.exception("batch request %s failed with an unexpected error", request_id)
            return Answered(500, error_body(internal_message(request_id), "internal_error"), request_id)

    async def _answer(self, endpoint: str, request: bytes, request_id: str) -> Answered:
        body = json.loads(request)
        refuse_credentials(body)
        req = _MODELS[endpoint].model_validate(body)
        if req.stream:
            raise InvalidRequest("a batch request is answered whole: stream is not taken", param="stream")
        if endpoint == "/v1/ocr":
            call = ocr_call(req, self.settings)
        elif endpoint == "/v1/chat/completions":
            call = chat_call(req, self.settings)
        else:
            call = completion_call(req, self.settings)
        call = await self.objects.fetch_media(call, max_bytes=self.max_object_bytes)
        call = replace(call, priority=BACKGROUND)
        if endpoint == "/v1/ocr":
            result = await result_of(self.service.read(call, request_id=request_id))
            return Answered(200, ocr_body(result), request_id,
                            (result.usage.prompt_tokens, result.usage.completion_tokens))
        started, done = None, None
        async with contextlib.aclosing(self.service.chat(call, request_id=request_id, whole=True)) as events:
            async for event in events:  # closed with this line: a cancelled batch aborts the engine's work
                if isinstance(event, Started):
                    started = event
                elif isinstance(event, ChatDone):
                    done = event
        prep = started.prep
        return Answered(200, completion_body(
            chat=endpoint == "/v1/chat/completions", request_id=request_id, created=int(time.time()),
            model=prep.model, text=done.text, finish=done.finish_reason, prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens, task=prep.task, requested_task=prep.requested_task),
            request_id, (done.prompt_tokens, done.completion_tokens))
