"""How a batch reads one document: in this process (``LocalReader``, the configured engine, as ``hyocr ocr``,
a PDF range by range) or as a job on a server (``RemoteReader``, through the client's jobs API)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..pipeline.media import is_document
from .pages import ranges, select, spec_of
from .partial import Partial


class ReadFailed(Exception):
    """This document could not be read (the message says why); the others go on. An attempt is spent."""


class ServerUnreachable(Exception):
    """``--url``: the server could not be reached, could not take work, or refused the caller (401/403: the API
    key). Not the document's failure: it stays pending (no attempt spent) and the run stops."""

    def __init__(self, message: str, reason: str = "server_unreachable") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a reader needs beyond the bytes: names, the attempt's idempotency key, a job to re-attach, where
    pages read so far are kept, and whom to tell about progress."""

    param: str  # the file, for error messages
    idempotency_key: str
    job_id: str | None  # a job an interrupted run submitted for this attempt
    on_page: Callable[[], None]  # a page finished
    on_submitted: Callable[[str], None]  # --url: the job exists (record it before waiting)
    on_total: Callable[[int], None] = lambda pages: None  # the pages this read will read, once known
    partial: Partial | None = None  # in-process: a PDF's pages read so far (None: read it all now)
    clamp: bool = False  # --pages is the command line's: cut to a shorter document, with a note


class Reader(Protocol):
    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]: ...


def _public(exc: Any, fallback: str = "internal error") -> str:
    return exc.message if exc.public else fallback


class LocalReader:
    """``service.read(call)`` on the engine in this process; the /v1/ocr body of the result. A PDF is read
    in ranges of ``range_pages`` pages, each one call with its own deadline (REQUEST_TIMEOUT), its pages kept
    in the ticket's ``partial`` as they finish: a document longer than one deadline covers is read to the
    end, and a retry or a rerun reads only the pages missing. The body is the one a single read gives."""

    def __init__(self, service: Any, *, range_pages: int = 8, max_pages: int = 10_000, retries: int = 3) -> None:
        self.service = service
        self.range_pages = max(1, min(range_pages, service.max_pages))  # a range is one call: within MAX_PAGES
        self.max_pages = max_pages  # pages of one document (JOB_MAX_PAGES, as for a job)
        self.retries = retries  # tries of a range that fails retryably without reading a page

    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]:
        from ..api.bodies import ocr_body
        from ..errors import HyocrError
        from .local import file_call

        try:
            call = file_call(data, ticket.param, options)
            if is_document(data) and ticket.partial is not None:
                return await self._document(call, ticket, ticket.partial)
            ticket.on_total(1 if not is_document(data) else 0)
            return ocr_body(await self._whole(call, ticket))
        except HyocrError as exc:
            raise ReadFailed(_public(exc)) from None

    async def _whole(self, call: Any, ticket: Ticket) -> Any:
        from ..types import PageRead, ReadDone

        result = None
        async with contextlib.aclosing(self.service.read(call)) as events:
            async for event in events:  # admitted and under the deadline, as on the server
                if isinstance(event, ReadDone):
                    result = event.result
                elif isinstance(event, PageRead):
                    ticket.on_page()
        if result is None:
            raise ReadFailed("the read ended without a result")
        return result

    async def _document(self, call: Any, ticket: Ticket, parts: Partial) -> dict[str, Any]:
        from ..api.bodies import ocr_body
        from ..types import OcrResult, Usage

        surveyed = await self.service.survey(call)  # the task checked, the PDF opened, its pages counted
        pages, note = select(call.pages, surveyed.pages, self.max_pages, clamp=ticket.clamp)
        missing = [p for p in pages if p not in parts.pages]
        ticket.on_total(len(missing))
        for chunk in ranges(missing, self.range_pages):
            await self._range(call, chunk, parts, ticket, lone=len(pages) == 1)
        read = tuple(parts.pages[p] for p in pages)
        result = OcrResult(id=f"ocr-{uuid.uuid4().hex}", model=surveyed.model, engine=self.service.engine.info.name,
                           task=surveyed.task, requested_task=surveyed.requested_task, pages=read,
                           usage=sum((p.usage for p in read), Usage()), timings=dict(parts.timings))
        body = ocr_body(result)
        return {**body, "note": note} if note else body

    async def _range(self, call: Any, chunk: list[int], parts: Partial, ticket: Ticket, *, lone: bool) -> None:
        """``chunk``'s pages read into ``parts``. A retryable failure (the deadline, an engine restarting) is
        tried again at once when the try read some pages (a slow machine: the rest get a deadline of their
        own), else up to ``retries`` tries, never again after a deadline that passed without a page."""
        from ..errors import GatewayTimeout, HyocrError

        tries = 0
        while todo := [p for p in chunk if p not in parts.pages]:
            before = len(parts.pages)
            try:
                # a range of a longer selection: its pages that cannot be rendered are error pages, all of them too
                await self._read_range(replace(call, pages=spec_of(todo), document_range=not lone), parts, ticket,
                                       lone=lone)
            except HyocrError as exc:
                if exc.status >= 500 and len(parts.pages) > before:
                    continue
                tries += 1
                if exc.status < 500 or isinstance(exc, GatewayTimeout) or tries >= self.retries:
                    where = "" if lone else f"page{'s' if len(todo) > 1 else ''} {spec_of(todo)}: "
                    raise ReadFailed(where + _public(exc)) from None
                await backoff(min(30.0, 2.0 ** tries))

    async def _read_range(self, call: Any, parts: Partial, ticket: Ticket, *, lone: bool) -> None:
        from ..errors import GatewayTimeout, HyocrError
        from ..types import FinishReason, PageRead, PageResult, ReadDone, Started

        prep = None
        try:
            async with contextlib.aclosing(self.service.read(call)) as events:
                async for event in events:
                    if isinstance(event, Started):
                        prep = event.prep
                    elif isinstance(event, PageRead):
                        parts.add_page(event.page)  # kept before it is counted: a stop now loses nothing
                        ticket.on_page()
                    elif isinstance(event, ReadDone):
                        parts.add_timings(event.result.timings)
        except HyocrError as exc:
            # A read of one page raises what, in a read of several, makes that page an error page
            # (pipeline/reading.py): in a document of several pages, this page failed, not the document.
            if prep is None or lone or len(prep.pages) != 1 or isinstance(exc, GatewayTimeout):
                raise
            page = prep.pages[0]
            parts.add_page(PageResult(page.index, page.width, page.height, "", finish_reason=FinishReason.ERROR,
                                      error=_public(exc, "the engine failed on this page")).read_from(page))
            ticket.on_page()


class PageCounter:
    """``--url`` with ``--pages``: a PDF's pages counted here (one render worker, its first page at the
    lowest DPI; a TIFF's from its headers), so the selection is cut to a shorter document before the job is
    submitted."""

    def __init__(self, settings: Any) -> None:
        from ..pipeline.pdf import PdfRenderer

        self.pdf = PdfRenderer(workers=1, timeout=settings.pdf_render_timeout,
                               memory_mb=settings.pdf_worker_memory_mb)
        self.max_pdf_bytes = settings.max_pdf_bytes

    async def count(self, data: bytes, param: str) -> int:
        from ..pipeline.tiff import tiff_page_frames
        from ..pipeline.pdf import RenderPlan

        if frames := tiff_page_frames(data):  # a TIFF document: counted from its headers
            return len(frames)
        lowest = 36
        plan = RenderPlan(pages="1", max_pages=1, fixed_dpi=lowest, min_dpi=lowest, max_dpi=lowest)
        return (await self.pdf.render(data, plan, param=param)).page_count

    def close(self) -> None:
        self.pdf.close()


class RemoteReader:
    """A job per document (``submit_job`` with the ticket's idempotency key, so a rerun re-attaches to the
    job an interrupted run submitted), its pages followed for progress, then its result."""

    def __init__(self, client: Any, poll: float = 1.0, counter: PageCounter | None = None) -> None:
        self.client, self.poll, self.counter = client, poll, counter

    async def read(self, data: bytes, options: Mapping[str, Any], ticket: Ticket) -> dict[str, Any]:
        from ..client import HyocrClientError

        pdf = is_document(data)
        sent = {k: v for k, v in options.items()
                if v not in (None, False) and (pdf or k not in ("pages", "prefer_text_layer"))}
        note = await self._clamped(data, sent, ticket) if pdf and ticket.clamp and sent.get("pages") else None
        try:
            job = await self.client.submit_job(data, idempotency_key=ticket.idempotency_key, **sent)
            ticket.on_submitted(job.id)
            ticket.on_total(job.pages.total)
            async for _position, _page in self.client.iter_job_pages(job.id, poll=self.poll):
                ticket.on_page()
            job = await self.client.wait(job.id, poll=self.poll)
            if job.status != "succeeded":
                message = (job.error or {}).get("message") or f"the job was {job.status}"
                raise ReadFailed(f"job {job.id}: {message}")
            body = (await self.client.job_result(job.id)).raw
        except HyocrClientError as exc:
            if unreachable(exc):
                raise ServerUnreachable(str(exc)) from None
            if refused(exc):
                raise ServerUnreachable(str(exc), "server_refused") from None
            raise ReadFailed(str(exc)) from None
        return {**body, "note": note} if note else body

    async def _clamped(self, data: bytes, sent: dict[str, Any], ticket: Ticket) -> str | None:
        """``sent["pages"]`` cut to the document's pages (counted here); the note when it was cut."""
        from ..errors import HyocrError

        if self.counter is None:
            return None
        try:
            count = await self.counter.count(data, ticket.param)
            pages, note = select(sent["pages"], count, count, clamp=True)
        except HyocrError as exc:
            raise ReadFailed(_public(exc)) from None
        sent["pages"] = spec_of(pages)
        return note


async def backoff(seconds: float) -> None:
    """The wait before a range is tried again (its own name, so a test can skip it without touching asyncio)."""
    await asyncio.sleep(seconds)


def refused(exc: Exception) -> bool:
    """The server refused the caller, not the document: a missing or wrong API key (401), a caller it does not
    let in (403: an IP allowlist). Every other document would get the same answer."""
    from ..client import HyocrClientError

    return isinstance(exc, HyocrClientError) and getattr(exc, "status", None) in (401, 403)


def unreachable(exc: Exception) -> bool:
    """No answer (refused, dropped, timed out on every try), or an answer that the server cannot take work
    now (502, 503: a proxy without a backend, a server starting or draining)."""
    from ..client import ConnectionFailed, ServiceUnavailable, Timeout

    return isinstance(exc, ConnectionFailed | Timeout) or (
        isinstance(exc, ServiceUnavailable) and exc.status in (502, 503))
