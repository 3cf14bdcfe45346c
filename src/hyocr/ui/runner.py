"""One UI run: the service's own stream, page by page, then the same result /v1/ocr returns.

The engine runs once per page: its text deltas are shown as they arrive, and the page's structure
(boxes, markdown, fields) is built from that same streamed text with ``build_page``, the function
``OcrService.run`` uses, so the UI and the API cannot disagree. Pages are read one after another
(not concurrently as ``run`` does) so that the text on screen is always one page's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TypeVar

from ..errors import GatewayTimeout, HyocrError
from ..pipeline.pages import build_page
from ..pipeline.pdf import page_without_engine
from ..pipeline.service import OcrCall, OcrService
from ..types import EngineChunk, FinishReason, OcrResult, PageImage, PageResult, Usage

log = logging.getLogger("hyocr.ui")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a run stands: the decoded pages, the page being read and its text so far, the pages
    finished, and, on the last snapshot only, the whole result."""

    request_id: str
    pages: tuple[PageImage, ...]
    current: int  # position in ``pages`` of the page being read
    text: str  # its text so far, as the engine wrote it (see render.stream_display)
    done: tuple[PageResult, ...] = ()
    result: OcrResult | None = None


async def stream_run(service: OcrService, call: OcrCall, *, every: float = 0.05) -> AsyncIterator[Snapshot]:
    """Snapshots of a run, at most one per ``every`` seconds while text streams.

    A run is admitted and timed like an API request: the service's admission control (503 at once
    when full) and its request deadline over all pages (504, the engine's work aborted). Raises
    ``HyocrError`` for a bad call or a failed single page; in a multi-page run a failed page becomes
    an error page and the others are still read, as in ``OcrService.run``.
    """
    async with await service.admission.acquire():
        prep = await service.prepare(call)
        yield Snapshot(prep.request_id, prep.pages, 0, "")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + service.request_timeout
        info = service.engine.info
        many = len(prep.pages) > 1
        started = time.perf_counter()
        first_text: float | None = None
        post_ms = 0.0
        done: list[PageResult] = []
        for n, page in enumerate(prep.pages):
            if not page.needs_engine:  # a PDF page read from its text layer, or one that could not be rendered
                done.append(page_without_engine(page))
                yield Snapshot(prep.request_id, prep.pages, n, done[-1].text, tuple(done))
                continue
            single = replace(prep, pages=(page,), request_id=f"{prep.request_id}-p{n}" if many else prep.request_id)
            raw: list[str] = []
            shown: list[str] = []
            blocks = []
            final = EngineChunk(finish_reason=FinishReason.STOP)
            last = 0.0
            try:
                async for chunk in service.until_deadline(service.stream(single), deadline):
                    if chunk.finish_reason is not None:
                        final = chunk
                        continue
                    raw.append(chunk.text)
                    blocks.extend(chunk.blocks)
                    # A detector's chunk carries its blocks: show their text, not the coordinate format.
                    shown.append(_shown(chunk))
                    if first_text is None:
                        first_text = time.perf_counter()
                    if time.perf_counter() - last >= every:
                        last = time.perf_counter()
                        yield Snapshot(prep.request_id, prep.pages, n, "".join(shown), tuple(done))
            except HyocrError as exc:
                if not many or isinstance(exc, GatewayTimeout):
                    raise
                if not exc.public:
                    log.error("ui request %s page %d failed: %s", prep.request_id, n, exc.message)
                message = exc.message if exc.public else "the engine failed on this page"
                done.append(PageResult(page.index, page.width, page.height, "",
                                       finish_reason=FinishReason.ERROR, error=message).read_from(page))
                continue
            t0 = time.perf_counter()
            done.append(build_page(
                prep.task, page, "".join(raw), tuple(blocks), final.finish_reason or FinishReason.STOP,
                Usage(final.prompt_tokens, final.completion_tokens), prep.call.fields,
                trim_loops=info.follows_prompts, single_key=prep.call.single_key,
            ).read_from(page))
            post_ms += (time.perf_counter() - t0) * 1000
            yield Snapshot(prep.request_id, prep.pages, n, "".join(shown), tuple(done))
    elapsed = (time.perf_counter() - started) * 1000
    usage = Usage()
    for p in done:
        usage = usage + p.usage
    result = OcrResult(
        id=prep.request_id, model=service.model_for(prep), engine=info.name, task=prep.task,
        requested_task=prep.requested_task, pages=tuple(done), usage=usage,
        timings={
            "decode_ms": round(prep.decode_ms, 2),
            "first_text_ms": round((first_text - started) * 1000, 2) if first_text else None,
            "engine_ms": round(elapsed - post_ms, 2),
            "postprocess_ms": round(post_ms, 2),
            "total_ms": round(prep.fetch_ms + prep.decode_ms + elapsed, 2),
        },
    )
    yield Snapshot(prep.request_id, prep.pages, len(prep.pages) - 1, done[-1].text, tuple(done), result)


def _shown(chunk: EngineChunk) -> str:
    if not chunk.blocks:
        return chunk.text
    lead = chunk.text[: len(chunk.text) - len(chunk.text.lstrip())]
    return lead + " ".join(b.text for b in chunk.blocks)


async def until_set(source: AsyncIterator[T], stop: asyncio.Event) -> AsyncIterator[T]:
    """``source``'s items until ``stop`` is set. Then ``source`` is cancelled where it waits, which
    closes the service's stream and so aborts the engine's work, even before its first token.

    (The UI's Stop button sets ``stop``; Gradio's own ``cancels=`` races with a generator that is
    mid-step and can leave the page showing errors.)
    """
    waiter = asyncio.ensure_future(stop.wait())
    step: asyncio.Future | None = None
    try:
        while not stop.is_set():
            step = asyncio.ensure_future(anext(source))
            await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        waiter.cancel()
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await step
        await source.aclose()
