"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.

Any ``model`` value is accepted (a single-model server; generic clients and the reference
article's snippet send "tencent/HunyuanOCR" whatever runs behind); responses name the real model.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ...pipeline.service import Prepared
from ...types import FinishReason
from ..convert import chat_call, completion_call
from ..disconnect import unless_disconnected
from ..protocol import ChatCompletionRequest, CompletionRequest, ErrorResponse
from ..render import hyocr_meta, openai_finish, sse_stream, usage_body
from ..serving import exposure
from .deps import service_of, settings_of

router = APIRouter(tags=["openai"])
_ERRORS = {400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 415: {"model": ErrorResponse}}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _task_headers(prep: Prepared) -> dict[str, str]:
    return {"X-Hyocr-Task": prep.task.value}


@router.post("/v1/chat/completions", responses=_ERRORS, summary="OpenAI chat completions with images")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    service = service_of(request)
    call, request_id = chat_call(body, settings_of(request)), f"chatcmpl-{uuid.uuid4().hex}"
    if body.stream:
        prep, chunks = await service.open_stream(call, request_id=request_id)
        created, model = int(time.time()), service.model_for(prep)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        first = [True]

        def make_chunk(text: str, finish: FinishReason | None) -> dict:
            delta: dict = {"content": text} if text or finish is None else {}
            if first[0]:
                delta["role"] = "assistant"
                first[0] = False
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": openai_finish(finish)}
            chunk = {"id": prep.request_id, "object": "chat.completion.chunk", "created": created,
                     "model": model, "choices": [choice]}
            if finish is not None:
                chunk["hyocr"] = hyocr_meta(prep.task, prep.requested_task, finish)
            return chunk

        def make_usage(prompt: int, completion: int) -> dict | None:
            if not include_usage:
                return None
            return {"id": prep.request_id, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [], "usage": usage_body(prompt, completion)}

        stream = sse_stream(chunks, make_chunk=make_chunk, make_usage=make_usage,
                            request_id=prep.request_id)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={**_SSE_HEADERS, **_task_headers(prep)})

    prep, text, final = await unless_disconnected(request, service.generate_text(call, request_id=request_id))
    created, model = int(time.time()), service.model_for(prep)
    return _json(
        {
            "id": prep.request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": openai_finish(final.finish_reason),
                }
            ],
            "usage": usage_body(final.prompt_tokens, final.completion_tokens),
            "hyocr": hyocr_meta(prep.task, prep.requested_task, final.finish_reason),
        },
        _task_headers(prep),
    )


@router.post("/v1/completions", responses=_ERRORS, summary="OpenAI completions (+ the article's 'image' field)")
async def completions(body: CompletionRequest, request: Request):
    service = service_of(request)
    call, request_id = completion_call(body, settings_of(request)), f"cmpl-{uuid.uuid4().hex}"
    if body.stream:
        prep, chunks = await service.open_stream(call, request_id=request_id)
        created, model = int(time.time()), service.model_for(prep)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def make_chunk(text: str, finish: FinishReason | None) -> dict:
            chunk = {"id": prep.request_id, "object": "text_completion", "created": created, "model": model,
                     "choices": [{"index": 0, "text": text, "logprobs": None,
                                  "finish_reason": openai_finish(finish)}]}
            if finish is not None:
                chunk["hyocr"] = hyocr_meta(prep.task, prep.requested_task, finish)
            return chunk

        def make_usage(prompt: int, completion: int) -> dict | None:
            if not include_usage:
                return None
            return {"id": prep.request_id, "object": "text_completion", "created": created,
                    "model": model, "choices": [], "usage": usage_body(prompt, completion)}

        stream = sse_stream(chunks, make_chunk=make_chunk, make_usage=make_usage,
                            request_id=prep.request_id)
        return StreamingResponse(stream, media_type="text/event-stream",
                                 headers={**_SSE_HEADERS, **_task_headers(prep)})

    prep, text, final = await unless_disconnected(request, service.generate_text(call, request_id=request_id))
    created, model = int(time.time()), service.model_for(prep)
    return _json(
        {
            "id": prep.request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None,
                         "finish_reason": openai_finish(final.finish_reason)}],
            "usage": usage_body(final.prompt_tokens, final.completion_tokens),
            "hyocr": hyocr_meta(prep.task, prep.requested_task, final.finish_reason),
        },
        _task_headers(prep),
    )


@router.get("/v1/models", summary="The model this server runs")
async def models(request: Request) -> dict:
    info = service_of(request).engine.info
    created = request.app.state.started_at
    adapters = [
        {"id": name, "object": "model", "created": created, "owned_by": "hyocr", "root": name, "parent": info.model}
        for name in info.adapters
    ]
    return {
        "object": "list",
        "data": [
            {
                "id": info.model,
                "object": "model",
                "created": created,
                "owned_by": "hyocr",
                "root": info.details.get("path", info.model),
                "hyocr": {
                    "engine": info.name,
                    "tasks": sorted(t.value for t in info.tasks),
                    "follows_prompts": info.follows_prompts,
                    **info.details,
                },
            },
            *adapters,
        ],
        # How the server is reachable and guarded; "warning" when it listens beyond loopback unguarded.
        "hyocr": exposure(settings_of(request)),
    }


def _json(body: dict, headers: dict[str, str]) -> JSONResponse:
    return JSONResponse(body, headers=headers)
