"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models (and /v1/models/{id}).

Any ``model`` value is accepted (a single-model server; generic clients and the reference
article's snippet send "tencent/HunyuanOCR" whatever runs behind); responses name the real model.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ...errors import NotFound
from ...types import ChatDone, ChatEvent, ChatText, EngineChunk, FinishReason, Prepared
from ..bodies import completion_body, hyocr_meta, openai_finish, replicas_body, sse_stream, usage_body
from ..convert import chat_call, completion_call
from ..disconnect import unless_disconnected
from ..protocol import ChatCompletionRequest, CompletionRequest, ErrorResponse
from ..serving import exposure
from .deps import caller_of, json_body, service_of, settings_of

router = APIRouter(tags=["openai"])
_ERRORS = {400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 415: {"model": ErrorResponse}}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/v1/chat/completions", responses=_ERRORS, summary="OpenAI chat completions with images",
             dependencies=[Depends(json_body)])
async def chat_completions(body: ChatCompletionRequest, request: Request):
    return await _answer(request, body, chat_call(body, settings_of(request)), _CHAT)


@router.post("/v1/completions", responses=_ERRORS, summary="OpenAI completions (+ the article's 'image' field)",
             dependencies=[Depends(json_body)])
async def completions(body: CompletionRequest, request: Request):
    return await _answer(request, body, completion_call(body, settings_of(request)), _COMPLETION)


@dataclass(frozen=True)
class _Shape:
    """Where the two OpenAI routes' streams differ: ids, the chunk's object name, how a chunk carries its text
    (a whole answer is bodies.completion_body, which a batch line's answer shares)."""

    id_prefix: str
    chunk_object: str  # of a streamed chunk
    delta: Callable[[str, FinishReason | None, bool], dict]  # (text, finish, first chunk?) -> the chunk's content


_CHAT = _Shape("chatcmpl", "chat.completion.chunk",
               lambda text, finish, first: {"delta": {**({"content": text} if text or finish is None else {}),
                                                      **({"role": "assistant"} if first else {})}})
_COMPLETION = _Shape("cmpl", "text_completion", lambda text, finish, first: {"text": text})


async def _answer(request: Request, body, call, shape: _Shape):
    events = service_of(request).chat(call, request_id=f"{shape.id_prefix}-{uuid.uuid4().hex}", whole=not body.stream,
                                      caller=caller_of(request))
    try:
        started = await unless_disconnected(request, anext(events))  # admitted and prepared: errors are HTTP's
    except BaseException:
        await events.aclose()
        raise
    prep, created = started.prep, int(time.time())
    headers = {"X-Hyocr-Task": prep.task.value}
    if body.stream:
        # The status line waits for the engine's first event, so a failure before any text (the engine, a deadline,
        # a structured-output grammar) is an HTTP error a client can retry on, as OpenAI's is, not a 200 whose
        # stream holds an error event. What a client sees first is unchanged: nothing before the first token.
        try:
            first = await unless_disconnected(request, anext(events))
        except BaseException:
            await events.aclose()
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_streamed(_resumed(first, events), prep, created, shape, include_usage),
                                 media_type="text/event-stream", headers={**_SSE_HEADERS, **headers})
    done = await unless_disconnected(request, _last(events))
    return JSONResponse(completion_body(
        chat=shape is _CHAT, request_id=prep.request_id, created=created, model=prep.model, text=done.text,
        finish=done.finish_reason, prompt_tokens=done.prompt_tokens, completion_tokens=done.completion_tokens,
        task=prep.task, requested_task=prep.requested_task), headers=headers)


async def _resumed(first: ChatEvent, events: AsyncIterator[ChatEvent]) -> AsyncIterator[ChatEvent]:
    """``events`` with its already-read first event put back in front."""
    try:
        yield first
        async for event in events:
            yield event
    finally:
        await events.aclose()


async def _last(events: AsyncIterator[ChatEvent]) -> ChatDone:
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, ChatDone):
                return event
    raise AssertionError("a chat ends with ChatDone")


def _streamed(events: AsyncIterator[ChatEvent], prep: Prepared, created: int, shape: _Shape,
              include_usage: bool) -> AsyncIterator[bytes]:
    first = [True]

    def make_chunk(text: str, finish: FinishReason | None) -> dict:
        choice = {"index": 0, **shape.delta(text, finish, first[0]), "logprobs": None,
                  "finish_reason": openai_finish(finish)}
        first[0] = False
        chunk = {"id": prep.request_id, "object": shape.chunk_object, "created": created, "model": prep.model,
                 "choices": [choice]}
        if finish is not None:
            chunk["hyocr"] = hyocr_meta(prep.task, prep.requested_task, finish)
        return chunk

    def make_usage(prompt: int, completion: int) -> dict | None:
        if not include_usage:
            return None
        return {"id": prep.request_id, "object": shape.chunk_object, "created": created, "model": prep.model,
                "choices": [], "usage": usage_body(prompt, completion)}

    return sse_stream(_as_chunks(events), make_chunk=make_chunk, make_usage=make_usage, request_id=prep.request_id)


async def _as_chunks(events: AsyncIterator[ChatEvent]) -> AsyncIterator[EngineChunk]:
    try:
        async for event in events:
            if isinstance(event, ChatText):
                yield EngineChunk(text=event.text)
            elif isinstance(event, ChatDone):
                yield EngineChunk(finish_reason=event.finish_reason, prompt_tokens=event.prompt_tokens,
                                  completion_tokens=event.completion_tokens)
    finally:
        await events.aclose()


@router.api_route("/v1/models", methods=["GET", "HEAD"], summary="The model this server runs")
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
                    "structured_outputs": info.structured,
                    # what a request that leaves them open decodes with (the checkpoint's generation_config)
                    "generation_defaults": info.defaults,
                    **info.details,
                    **replicas_body(service_of(request).engine),
                },
            },
            *adapters,
        ],
        # How the server is reachable and guarded; "warning" when it listens beyond loopback unguarded.
        "hyocr": exposure(settings_of(request)),
    }


@router.get("/v1/models/{model_id:path}", summary="One model this server runs (as listed by /v1/models)")
async def model(request: Request, model_id: str) -> dict:
    listed = await models(request)
    for entry in listed["data"]:
        if entry["id"] == model_id:
            return entry
    served = ", ".join(e["id"] for e in listed["data"])
    raise NotFound(f"no model {model_id!r} here; this server runs {served}", param="model", code="model_not_found")
