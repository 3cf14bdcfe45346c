"""One UI run: the service's own stream, page by page, as snapshots of what to show.

The run is ``OcrService.read(call, deltas=True)``: admitted and timed like an API request, its pages read
one after another with their text as the engine writes it, each page built by the same rule as the
API's, and the last event the same result /v1/ocr returns (plus the time to the first text). What is
here is only what the page shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

from ..pipeline.service import OcrService
from ..types import OcrCall, OcrResult, PageImage, PageRead, PageResult, PageText, ReadDone, Started

log = logging.getLogger("hyocr.ui")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a run stands: the decoded pages, the page being read and its text so far, the pages
    finished, and, on the last snapshot only, the whole result."""

    request_id: str
    pages: tuple[PageImage, ...]
    current: int  # position in ``pages`` of the page being read
    text: str  # its text so far, as the engine wrote it (see display.stream_display)
    done: tuple[PageResult, ...] = ()
    result: OcrResult | None = None


async def stream_run(service: OcrService, call: OcrCall, *, every: float = 0.05) -> AsyncIterator[Snapshot]:
    """Snapshots of a run, at most one per ``every`` seconds while text streams. Raises ``HyocrError``
    for a bad call or a failed single page (a failed page of several is an error page)."""
    events = service.read(call, deltas=True)
    async with contextlib.aclosing(events):
        prep = None
        current, shown, done = 0, [], []
        last = 0.0
        async for event in events:
            if isinstance(event, Started):
                prep = event.prep
                yield Snapshot(prep.request_id, prep.pages, 0, "")
            elif isinstance(event, PageText):
                if event.position != current:
                    current, shown = event.position, []
                shown.append(_shown(event))
                if time.perf_counter() - last >= every:
                    last = time.perf_counter()
                    yield Snapshot(prep.request_id, prep.pages, current, "".join(shown), tuple(done))
            elif isinstance(event, PageRead):
                if event.position != current:
                    current, shown = event.position, []
                done.append(event.page)
                text = "".join(shown) if shown else event.page.text
                yield Snapshot(prep.request_id, prep.pages, current, text, tuple(done))
            elif isinstance(event, ReadDone):
                yield Snapshot(prep.request_id, prep.pages, len(prep.pages) - 1, done[-1].text, tuple(done),
                               event.result)


def _shown(delta: PageText) -> str:
    """A detector's delta carries its blocks: show their text, not the coordinate format."""
    if not delta.blocks:
        return delta.text
    lead = delta.text[: len(delta.text) - len(delta.text.lstrip())]
    return lead + " ".join(b.text for b in delta.blocks)


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
