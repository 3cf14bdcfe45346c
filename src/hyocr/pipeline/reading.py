"""A prepared call's pages through the engine, one engine request per page, as events: each page as it
finishes (``PageRead``), then the whole result (``ReadDone``) with the pages in page order.

Pages run concurrently (vLLM batches them), or, for a viewer that watches the text appear
(``deltas``), one after another with their text as it streams (``PageText``), so the text on screen is
always one page's. Either way each page is built by the one page rule (``pages.build_page``), and a page
that fails in a document of several becomes an error page while the others are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from ..errors import HyocrError
from ..hunyuan import versions
from ..observability.logs import record
from ..observability.tracing import span
from ..types import (
    EngineChunk,
    FinishReason,
    OcrResult,
    PageImage,
    PageRead,
    PageResult,
    PageText,
    Prepared,
    ReadDone,
    Task,
    TextBlock,
    Usage,
)
from .engine_run import EngineRun
from .pages import build_page
from .pdf import page_without_engine

PageEvent = PageText | PageRead | ReadDone
log = logging.getLogger("hyocr.pipeline")


async def read_pages(run: EngineRun, prep: Prepared, *, deltas: bool = False) -> AsyncIterator[PageEvent]:
    started = time.perf_counter()
    finished: list[tuple[int, PageResult, float]] = []
    first_text: list[float] = []
    total = len(prep.pages)
    if deltas:
        for n, page in enumerate(prep.pages):
            async with contextlib.aclosing(_page_events(run, prep, n, page, first_text)) as events:
                async for event in events:
                    if isinstance(event, PageText):
                        yield event
                    else:
                        finished.append(event)
                        yield PageRead(n, event[1], len(finished), total)
    else:
        async def numbered(n: int, page: PageImage) -> tuple[int, PageResult, float]:
            return (n, *await _page(run, prep, page))

        tasks = [asyncio.ensure_future(numbered(n, page)) for n, page in enumerate(prep.pages)]
        try:
            for done in asyncio.as_completed(tasks):
                finished.append(await done)
                yield PageRead(finished[-1][0], finished[-1][1], len(finished), total)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    yield ReadDone(_result(run, prep, finished, started, first_text if deltas else None))


def _result(run: EngineRun, prep: Prepared, finished: list[tuple[int, PageResult, float]], started: float,
            first_text: list[float] | None) -> OcrResult:
    elapsed = (time.perf_counter() - started) * 1000
    finished.sort(key=lambda item: item[0])
    pages = tuple(r for _, r, _ in finished)
    post_ms = sum(ms for _, _, ms in finished)
    usage = Usage()
    for r in pages:
        usage = usage + r.usage
    timings = {"decode_ms": round(prep.decode_ms, 2)}
    if first_text is not None:  # a viewer's figure: when the first text appeared (None: no text)
        timings["first_text_ms"] = round((first_text[0] - started) * 1000, 2) if first_text else None
    timings.update({
        "engine_ms": round(elapsed - post_ms, 2),
        "postprocess_ms": round(post_ms, 2),
        "total_ms": round(prep.fetch_ms + prep.decode_ms + elapsed, 2),
    })
    record(prompt_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
           repetition_stops=sum(r.finish_reason is FinishReason.REPETITION for r in pages),
           engine_ms=timings["engine_ms"], postprocess_ms=timings["postprocess_ms"])
    return OcrResult(id=prep.request_id, model=prep.model, engine=run.engine.info.name, task=prep.task,
                     requested_task=prep.requested_task, pages=pages, usage=usage, timings=timings)


def _suffix(prep: Prepared, page: PageImage) -> str:
    return f"-p{page.index}" if len(prep.pages) > 1 else ""


async def _page(run: EngineRun, prep: Prepared, page: PageImage) -> tuple[PageResult, float]:
    """One page read to the end: (its result, post-processing milliseconds)."""
    async with contextlib.aclosing(_page_events(run, prep, 0, page, None)) as events:
        async for event in events:
            if not isinstance(event, PageText):
                return event[1:]
    raise AssertionError("a page ends with its result")


async def _page_events(run: EngineRun, prep: Prepared, n: int, page: PageImage, first_text: list[float] | None):
    """One page read to the end: its text as it streams (``PageText``s, only when ``first_text`` is a
    list, which gets the moment the first text appeared), then (n, result, post-processing ms)."""
    if not page.needs_engine:  # a PDF page read from its text layer, or one that could not be rendered
        yield n, page_without_engine(page), 0.0
        return
    request = run.request(prep, (page,), _suffix(prep, page))
    parts: list[str] = []
    blocks: list[TextBlock] = []
    last = EngineChunk()
    try:
        with span("hyocr.engine", current=False, request_id=request.request_id, page=page.index,
                  task=prep.task.value):
            async with contextlib.aclosing(run.stream(request)) as chunks:
                async for chunk in chunks:
                    parts.append(chunk.text)
                    blocks.extend(chunk.blocks)
                    last = chunk
                    if first_text is None or not (chunk.text or chunk.blocks):
                        continue
                    if not first_text:
                        first_text.append(time.perf_counter())
                    yield PageText(n, chunk.text, chunk.blocks)
    except HyocrError as exc:
        yield n, _failed(prep, page, exc), 0.0
        return
    yield (n, *_built(run, prep, page, "".join(parts), tuple(blocks), last))


def _failed(prep: Prepared, page: PageImage, exc: HyocrError) -> PageResult:
    """One failed page does not fail a document of several; a single page's failure is the request's. So is
    a retryable one (5xx: a stalled or restarting engine, overload) in background work (a job's range, a batch
    line): its runner tries the read again (the pages stored so far stay) where an error page would be final."""
    if len(prep.pages) == 1 or (exc.status >= 500 and prep.call.priority > 0):
        raise exc
    if not exc.public:
        log.error("request %s page %d failed: %s: %s", prep.request_id, page.index, type(exc).__name__, exc.message)
    message = exc.message if exc.public else "the engine failed on this page"
    return PageResult(page.index, page.width, page.height, "", finish_reason=FinishReason.ERROR,
                      error=message).read_from(page)


def _built(run: EngineRun, prep: Prepared, page: PageImage, text: str, blocks: tuple[TextBlock, ...],
           last: EngineChunk) -> tuple[PageResult, float]:
    t0 = time.perf_counter()
    with span("hyocr.postprocess", page=page.index):
        result = build_page(
            prep.task, page, text, blocks, last.finish_reason or FinishReason.STOP,
            Usage(last.prompt_tokens, last.completion_tokens), prep.call.fields,
            trim_loops=run.engine.info.follows_prompts, single_key=prep.call.single_key,
            structured=prep.call.sampling.structured if prep.task is Task.EXTRACT else None,
            rules=versions.of(run.engine.info.version),
        ).read_from(page)
    return result, (time.perf_counter() - t0) * 1000
