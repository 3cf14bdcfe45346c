"""Internal results -> wire JSON: /v1/ocr bodies, OpenAI objects and their SSE chunks."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from ..errors import HyocrError
from ..types import EngineChunk, FinishReason, OcrResult, PageResult, Task
from .errors import hyocr_error_body

# OpenAI clients know "stop" and "length"; a repetition stop is a kind of "stop" for them, and
# hyocr says which in its own field.
_OPENAI_FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.REPETITION: "stop",
    FinishReason.ABORT: "abort",
    FinishReason.ERROR: "error",
}


def ocr_body(result: OcrResult) -> dict:
    return {
        "id": result.id,
        "object": "ocr.result",
        "created": int(time.time()),
        "model": result.model,
        "engine": result.engine,
        "task": result.task.value,
        "requested_task": result.requested_task.value,
        "text": result.text,
        **({"markdown": result.markdown} if result.markdown is not None else {}),  # documents: pages joined
        "pages": [page_body(p) for p in result.pages],
        "usage": usage_body(result.usage.prompt_tokens, result.usage.completion_tokens),
        "timings": result.timings,
    }


def page_body(page: PageResult) -> dict:
    body: dict = {
        "index": page.index,
        "width": page.width,
        "height": page.height,
        "text": page.text,
        "blocks": [
            {
                "text": b.text,
                "box": list(b.box) if b.box else None,
                "score": b.score,
                **({"polygon": [list(p) for p in b.polygon]} if b.polygon else {}),
            }
            for b in page.blocks
        ],
        "finish_reason": page.finish_reason.value,
    }
    if page.markdown is not None:
        body["markdown"] = page.markdown
    if page.fields is not None:
        body["fields"] = page.fields
    if page.error is not None:
        body["error"] = page.error
    if page.dpi is not None:  # PDF pages: the resolution it was rendered at
        body["dpi"] = page.dpi
    if page.source is not None:  # PDF pages: "render" (OCR) or "text_layer" (the PDF's own text)
        body["source"] = page.source
    return body


def usage_body(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def hyocr_meta(task: Task, requested: Task, finish: FinishReason | None = None) -> dict:
    """hyocr's own fields on OpenAI objects (clients ignore unknown fields)."""
    meta = {"task": task.value, "requested_task": requested.value}
    if finish is not None:
        meta["finish_reason"] = finish.value
    return meta


def openai_finish(reason: FinishReason | None) -> str | None:
    return _OPENAI_FINISH[reason] if reason is not None else None


def sse(data: dict | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


async def sse_stream(
    chunks: AsyncIterator[EngineChunk],
    *,
    make_chunk,  # (delta_text, finish_reason | None) -> dict
    make_usage,  # (prompt, completion) -> dict | None
    request_id: str,
) -> AsyncIterator[bytes]:
    """Engine chunks -> OpenAI SSE events, ending in ``[DONE]``; an engine error becomes an error event."""
    try:
        async for chunk in chunks:
            if chunk.text:
                yield sse(make_chunk(chunk.text, None))
            if chunk.finish_reason is not None:
                yield sse(make_chunk("", chunk.finish_reason))
                usage = make_usage(chunk.prompt_tokens, chunk.completion_tokens)
                if usage is not None:
                    yield sse(usage)
    except HyocrError as exc:
        _, body = hyocr_error_body(exc, request_id)
        yield sse(body)
    finally:
        # Deterministic clean-up when the client goes away: closing the chunk stream aborts the
        # engine request and frees its admission slot now, not whenever the generator is collected.
        await chunks.aclose()
    yield sse("[DONE]")
