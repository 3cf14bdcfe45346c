"""Internal results -> wire JSON: /v1/ocr bodies, OpenAI objects and their SSE chunks."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

from ..errors import HyocrError
from ..observability.logs import record
from ..types import EngineChunk, FinishReason, OcrResult, PageResult, Task
from .errors import hyocr_error_body
from .protocol import Block, OcrResponse, Page, ResultModel, UsageInfo

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
    """The /v1/ocr body (``protocol.OcrResponse``): absent optional keys left out, numbers as the engine gave them."""
    return _body(OcrResponse(
        id=result.id,
        created=int(time.time()),
        model=result.model,
        engine=result.engine,
        task=result.task.value,
        requested_task=result.requested_task.value,
        text=result.text,
        markdown=result.markdown,  # documents: the pages' markdown joined
        pages=[_page(p) for p in result.pages],
        usage=_usage(result.usage.prompt_tokens, result.usage.completion_tokens),
        timings=result.timings,
    ))


def replicas_body(engine) -> dict:
    """``{"replicas": [...]}``: the engine's copies of the model (data-parallel cores, Ray Serve replicas),
    for /ready and /v1/models; empty for an engine that is one copy."""
    replicas = engine.replicas()
    return {"replicas": [r.body() for r in replicas]} if replicas else {}


def page_body(page: PageResult) -> dict:
    """One page of the /v1/ocr body (``protocol.Page``); stream=true sends each in an ``ocr.page`` event."""
    return _body(_page(page))


def usage_body(prompt: int, completion: int) -> dict:
    return _usage(prompt, completion).model_dump()


def _body(model: ResultModel) -> dict:
    # mode="python": an int stays an int, as json.dumps then writes it; the values are JSON types already.
    return model.model_dump(context={"omit_absent": True})


def _page(page: PageResult) -> Page:
    return Page(
        index=page.index,
        width=page.width,
        height=page.height,
        text=page.text,
        blocks=[Block(text=b.text, box=b.box, score=b.score, polygon=b.polygon, category=b.category)
                for b in page.blocks],
        finish_reason=page.finish_reason.value,
        markdown=page.markdown,
        fields=page.fields,
        error=page.error,
        dpi=page.dpi,  # PDF pages: the resolution it was rendered at
        source=page.source,  # PDF pages: "render" (OCR) or "text_layer" (its own text); TIFF pages: "image"
    )


def _usage(prompt: int, completion: int) -> UsageInfo:
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


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
        record(stream_error=exc.code or type(exc).__name__)  # the access line says 200: the status line had gone
        yield sse(body)
    finally:
        # Deterministic clean-up when the client goes away: closing the chunk stream aborts the
        # engine request and frees its admission slot now, not whenever the generator is collected.
        await chunks.aclose()
    yield sse("[DONE]")


# ---------------------------------------------------------------- the jobs API


def job_body(job) -> dict:
    """A job (``jobs.store.JobRecord``) on the wire: GET /v1/jobs/{id}, the list, the webhook's data."""
    def when(t: float | None) -> int | None:
        return None if t is None else int(t)

    return {
        "id": job.id, "object": "ocr.job", "status": job.status, "created_at": when(job.created_at),
        "started_at": when(job.started_at), "finished_at": when(job.finished_at),
        "expires_at": when(job.expires_at), "model": job.model, "engine": job.engine, "task": job.task,
        "requested_task": job.requested_task,
        "pages": {"total": job.pages_total, "done": job.pages_done, "failed": job.pages_failed},
        "queue_position": job.queue_position, "error": job.error,
        **({"output": {"uri": job.output_uri, "status": job.output_state, "error": job.output_error}}
           if getattr(job, "output_uri", None) else {}),
    }


def job_page_body(seq: int, position: int, page: PageResult) -> dict:
    """One stored page of a job (GET /v1/jobs/{id}/pages): ``seq`` orders pages as they were stored."""
    return {"seq": seq, "position": position, "page": page_body(page)}


def completion_body(*, chat: bool, request_id: str, created: int, model: str, text: str, finish: FinishReason,
                    prompt_tokens: int, completion_tokens: int, task: Task, requested_task: Task) -> dict:
    """A whole (not streamed) chat completion or completion, as /v1/chat/completions and /v1/completions
    answer: the body of a batch line for those endpoints."""
    choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
    return {
        "id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
        "model": model,
        "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": openai_finish(finish)}],
        "usage": usage_body(prompt_tokens, completion_tokens),
        "hyocr": hyocr_meta(task, requested_task, finish),
    }


# ---------------------------------------------------------------- the OpenAI Batch API


def _when(t: float | None) -> int | None:
    return None if t is None else int(t)


def file_body(record) -> dict:
    """A file (``jobs.files.FileRecord``) as OpenAI's File object."""
    return {"id": record.id, "object": "file", "bytes": record.bytes, "created_at": int(record.created_at),
            "filename": record.filename, "purpose": record.purpose, "status": "processed",
            "expires_at": _when(record.expires_at), "status_details": None}


def batch_body(batch) -> dict:
    """A batch (``jobs.batch_store.BatchRecord``) as OpenAI's Batch object, with hyocr's ``output_uri`` and
    its outcome (``output_export``) where one was asked for."""
    body = {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window,
        "status": batch.status, "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "created_at": int(batch.created_at), "in_progress_at": _when(batch.in_progress_at),
        "expires_at": _when(batch.expires_at), "finalizing_at": _when(batch.finalizing_at),
        "completed_at": _when(batch.completed_at), "failed_at": _when(batch.failed_at),
        "expired_at": _when(batch.expired_at), "cancelling_at": _when(batch.cancelling_at),
        "cancelled_at": _when(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "usage": {"input_tokens": batch.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": batch.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": batch.prompt_tokens + batch.completion_tokens},
        "metadata": batch.metadata,
    }
    if batch.output_uri:
        body["output_uri"] = batch.output_uri
        body["output_export"] = batch.export
    return body
