"""PDF documents -> page images, rendered by PDFium in worker processes.

    PDF bytes (magic ``%PDF-``, at most max_pdf_bytes)
      -> a render worker (a spawned process with a memory limit): open, select pages, per page
         choose a DPI and render it (or take its text layer), raw RGB back over a pipe
      -> one ``PageImage`` per selected page, in page order

PDFium is not thread-safe and a hostile document can hang or crash it, so it never runs in the
server process. A worker that overruns ``pdf_render_timeout`` (to open the document or render one
page) or dies is killed and replaced, and the request gets a 422; the server keeps serving.
This is the server's side (the plan, the pool, the errors); ``pdf_worker`` is the worker's (page
selection, the DPI per page, text-layer trust, PDFium).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import socket
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection

from PIL import Image

from ..errors import HyocrError, InvalidMedia, InvalidRequest, PayloadTooLarge, ServiceUnavailable, UnprocessableDocument
from ..hunyuan.geometry import PixelBounds, visual_tokens
from ..types import FinishReason, PageImage, PageResult

log = logging.getLogger("hyocr.pdf")

POINTS_PER_INCH = 72
START_TIMEOUT = 60.0  # seconds for a new worker to import PDFium and say it is ready


# The worker reports errors as (kind, message, param, code): exceptions do not cross the pipe.
ERROR_KINDS: dict[str, type[HyocrError]] = {
    "invalid": InvalidMedia, "request": InvalidRequest, "too_large": PayloadTooLarge,
    "unprocessable": UnprocessableDocument,
}


def error_from(kind: str, message: str, param: str | None, code: str | None) -> HyocrError:
    return ERROR_KINDS[kind](message, param=param, code=code)


def error_parts(exc: HyocrError) -> tuple[str, str, str | None, str | None]:
    kind = next(k for k, cls in ERROR_KINDS.items() if isinstance(exc, cls))
    return kind, exc.message, exc.param, exc.code


@dataclass(frozen=True, slots=True)
class RenderPlan:
    """How to read one document: the worker's whole instruction (pickled to it)."""

    pages: str | None = None  # "2-5,8" (1-based); None: every page
    max_pages: int = 64
    max_pixels: int = 2048 * 2048  # rendered pixels per page
    max_dpi: int = 300
    min_dpi: int = 36
    fixed_dpi: int | None = None  # engines that are not HunyuanOCR: this DPI, lowered only to fit max_pixels
    bounds: tuple[int, int] | None = None  # HunyuanOCR engines: (min_pixels, max_pixels) of its resize
    token_budget: int | None = None  # HunyuanOCR engines: visual tokens a page may cost
    text_layer: bool = False  # take a page's own text when it is reliable
    # Rendered pixels for the whole document (None: no limit). Pages past it are error pages: a
    # few-kB PDF of 64 giant pages would otherwise hold gigabytes of pixels in the server at once.
    max_total_pixels: int | None = None
    # A selection where every page failed is the document's 4xx (nothing to read), unless the caller reads the
    # document range by range (jobs, hyocr batch): then its pages are error pages like any other.
    keep_error_pages: bool = False

    @classmethod
    def for_engine(cls, follows_prompts: bool, settings=None) -> RenderPlan:
        """HunyuanOCR engines (they follow prompts): the highest DPI within their pixel bounds and the
        visual-token budget. Others (rapidocr, a detector): a fixed DPI, lowered only past the image
        pixel cap."""
        if settings is None:
            from ..config import Settings

            settings = Settings.model_construct()  # the defaults, without reading the environment
        common = {"max_pages": settings.max_pages, "max_dpi": settings.pdf_max_dpi, "min_dpi": settings.pdf_min_dpi,
                  "max_total_pixels": settings.max_document_pixels}
        if not follows_prompts:
            return cls(max_pixels=settings.max_image_pixels, fixed_dpi=settings.pdf_detector_dpi, **common)
        budget = settings.pdf_max_visual_tokens or default_token_budget(settings.min_pixels, settings.max_pixels)
        return cls(max_pixels=settings.max_pixels, bounds=(settings.min_pixels, settings.max_pixels),
                   token_budget=budget, **common)


def default_token_budget(min_pixels: int, max_pixels: int) -> int:
    """The tokens of a square page at max_pixels (4162 for 2048x2048): the model's own ceiling."""
    side = math.isqrt(max_pixels)
    return visual_tokens(side, side, PixelBounds(min_pixels, max_pixels))


def page_without_engine(page: PageImage) -> PageResult:
    """The result of a PDF page that never reaches the engine: read from its text layer, or failed."""
    if page.error is not None:
        return PageResult(page.index, page.width, page.height, "", finish_reason=FinishReason.ERROR,
                          error=page.error, dpi=page.dpi, source=page.source)
    text = page.text or ""
    return PageResult(page.index, page.width, page.height, text, raw_text=text, dpi=page.dpi, source=page.source)


@dataclass(frozen=True, slots=True)
class RenderedDocument:
    page_count: int  # pages in the whole document
    pages: tuple[PageImage, ...]  # the selected ones, in page order


class _Stop(Exception):
    """The worker must go: it overran, died or was abandoned. ``error`` is for the client (None: gone)."""

    def __init__(self, error: HyocrError | None) -> None:
        super().__init__(error.message if error else "abandoned")
        self.error = error


class _Worker:
    """One render process. A plain subprocess, not multiprocessing's spawn: that would re-run the
    server's ``__main__`` in the child (and forking a threaded server is unsafe)."""

    def __init__(self, memory_mb: int) -> None:
        ours, theirs = socket.socketpair()
        # Isolated (-I: no current folder, no PYTHON* variables), importing from exactly the server's path.
        code = (f"import sys; sys.path[:] = {sys.path!r}; from hyocr.pipeline.pdf_worker import main; "
                f"main({theirs.fileno()}, {int(memory_mb)})")
        self.process = subprocess.Popen([sys.executable, "-I", "-c", code], pass_fds=(theirs.fileno(),),
                                        stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.ready = False
        self.killed = False  # by close() (shutdown, Ctrl-C) while a pool thread may be reading from it

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.killed = True
        self.process.kill()
        self.process.wait(5)
        self.conn.close()


class PdfRenderer:
    """A pool of ``workers`` render processes (spawned on first use, replaced when killed)."""

    def __init__(self, *, workers: int = 2, timeout: float = 15.0, memory_mb: int = 1024) -> None:
        self.size, self.timeout, self.memory_mb = workers, timeout, memory_mb
        self.kills = 0  # workers killed (timeouts, crashes, abandoned renders)
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()  # idle or busy: close() ends them all
        self._threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hyocr-pdf")
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        atexit.register(_close_at_exit, weakref.ref(self))

    async def render(self, data: bytes, plan: RenderPlan, *, param: str | None = None) -> RenderedDocument:
        """The plan's pages of the PDF ``data``; errors about the document name ``param`` (its field)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._slots, self._loop = asyncio.Semaphore(self.size), loop
        async with self._slots:  # type: ignore[union-attr]
            worker = self._idle.pop() if self._idle else None
            abandon = threading.Event()
            job = loop.run_in_executor(self._threads, self._job, worker, data, plan, abandon)
            job.add_done_callback(self._put_back)
            try:
                outcome, _ = await asyncio.shield(job)
            except asyncio.CancelledError:  # deadline or client gone: the thread kills the worker
                abandon.set()
                raise
        if isinstance(outcome, HyocrError):
            outcome.param = outcome.param or param
            raise outcome
        return outcome

    def close(self) -> None:
        for worker in list(self._live):
            self._kill(worker)
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _put_back(self, job: asyncio.Future) -> None:
        worker = job.result()[1] if not job.cancelled() and job.exception() is None else None
        if worker is None:
            return
        if len(self._idle) < self.size:
            self._idle.append(worker)
        else:
            self._kill(worker)

    def _kill(self, worker: _Worker) -> None:
        self._live.discard(worker)
        worker.kill()

    # ------------------------------------------------------------- on a pool thread (blocking)

    def _job(self, worker: _Worker | None, data: bytes, plan: RenderPlan, abandon: threading.Event):
        """(RenderedDocument or the error to raise, the worker if it may be reused). Never raises."""
        try:
            if worker is None or not worker.alive():
                if worker is not None:
                    self._kill(worker)
                worker = _Worker(self.memory_mb)
                self._live.add(worker)
            if not worker.ready:
                self._receive(worker, START_TIMEOUT, abandon, "starting the PDF renderer")
                worker.ready = True
            worker.conn.send(plan)
            worker.conn.send_bytes(data)
            return self._collect(worker, plan, abandon), worker
        except _Stop as stop:
            self.kills += 1
            if worker is not None:
                self._kill(worker)
            return stop.error, None
        except HyocrError as exc:  # the document's own problem, reported by a healthy worker
            return exc, worker
        except Exception:  # a broken pipe, say: the worker is not trusted again
            if worker is not None and worker.killed:  # closed under us (shutting down): nothing went wrong
                return _shutting_down(), None
            log.exception("PDF render worker failed")
            if worker is not None:
                self._kill(worker)
            return UnprocessableDocument("the PDF renderer failed on this document"), None

    def _collect(self, worker: _Worker, plan: RenderPlan, abandon: threading.Event) -> RenderedDocument:
        _, count, selected = self._receive(worker, self.timeout, abandon, "opening the PDF")
        pages: list[PageImage] = []
        errors: list[HyocrError] = []
        for index in selected:
            message = self._receive(worker, self.timeout, abandon, f"rendering page {index + 1}")
            kind = message[0]
            if kind == "page":
                _, _, dpi, width, height = message
                pixels = worker.conn.recv_bytes()
                image = Image.frombuffer("RGB", (width, height), pixels, "raw", "RGB", 0, 1)
                pages.append(PageImage(image, index, "PDF", dpi=dpi, source="render"))
            elif kind == "text":
                _, _, width, height, text = message
                pages.append(PageImage(None, index, "PDF", dpi=POINTS_PER_INCH, source="text_layer", text=text,
                                       size=(width, height)))
            else:  # "page_error": this page becomes an error page, as a failed engine page does
                _, _, width, height, *parts = message
                errors.append(error_from(*parts))
                pages.append(PageImage(None, index, "PDF", dpi=POINTS_PER_INCH, source="render",
                                       error=errors[-1].message, size=(width, height)))
        self._receive(worker, self.timeout, abandon, "closing the PDF")  # "done"
        if errors and len(errors) == len(pages) and not plan.keep_error_pages:  # nothing readable: a 4xx
            raise errors[0]
        return RenderedDocument(count, tuple(pages))

    def _receive(self, worker: _Worker, timeout: float, abandon: threading.Event, doing: str) -> tuple:
        """The worker's next message within ``timeout`` seconds; an error it reports is raised."""
        deadline = time.monotonic() + timeout
        while not worker.conn.poll(min(0.1, max(0.0, deadline - time.monotonic()))):
            if abandon.is_set():
                raise _Stop(None)
            if time.monotonic() >= deadline:
                log.warning("PDF render worker killed: %s took longer than %gs", doing, timeout)
                raise _Stop(UnprocessableDocument(
                    f"{doing} took longer than {timeout:g} s; the document is damaged or too complex",
                    code="pdf_render_timeout"))
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            if worker.killed:
                raise _Stop(_shutting_down()) from None
            try:
                code = worker.process.wait(1)
            except subprocess.TimeoutExpired:
                code = None
            log.warning("PDF render worker died while %s (exit code %s)", doing, code)
            raise _Stop(UnprocessableDocument(
                f"the PDF renderer failed while {doing}: the document is damaged or needs too much memory")) from None
        if message[0] == "error":
            raise error_from(*message[1:])
        if message[0] == "fatal":  # the worker is exiting
            raise _Stop(error_from(*message[1:]))
        return message


def _shutting_down() -> ServiceUnavailable:
    return ServiceUnavailable("the PDF renderer is shutting down", code="shutting_down")


def _close_at_exit(ref: weakref.ref) -> None:
    renderer = ref()
    if renderer is not None:
        renderer.close()
