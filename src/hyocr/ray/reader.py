"""``hyocr batch --ray``'s engine actors (``map_batches`` with a callable class, an actor pool of
``ray_replicas``): ``PageReader`` builds one engine and one OcrService from the batch's settings and reads
the rows of a batch concurrently on an event loop of its own, so a continuously batching engine (vLLM) is
fed; ``Meter`` counts its pages and busy time (its pages/s); ``PageOutcome`` is what it makes of a page,
pickled back to the driver.

Ray is optional (``pip install "hyocr[ray]"``) and only imported here, inside functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pickle
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .pages import RenderedPages, public_message

if TYPE_CHECKING:
    from ..errors import HyocrError
    from ..types import PageImage, PageResult, Task
    from .pages import Rendered

log = logging.getLogger("hyocr.ray")


@dataclass(frozen=True, slots=True)
class PageOutcome:
    """What an engine actor made of one page: the page (read, or an error page in a document of several),
    or the error that fails its document; and what the document's body says about the read."""

    page: PageResult | None
    error: str | None
    task: Task | None = None
    requested_task: Task | None = None
    model: str = ""
    engine: str = ""
    timings: dict[str, float] = field(default_factory=dict)


class Meter:
    """An actor's pages and the time it had at least one in flight (its pages/s), on its event loop."""

    def __init__(self) -> None:
        self.pages, self.busy_s, self._in_flight, self._since = 0, 0.0, 0, 0.0

    def enter(self) -> None:
        if not self._in_flight:
            self._since = time.monotonic()
        self._in_flight += 1

    def leave(self, read: bool) -> None:
        self._in_flight -= 1
        self.pages += read
        if not self._in_flight:
            self.busy_s += time.monotonic() - self._since

    def busy(self) -> float:
        return self.busy_s + (time.monotonic() - self._since if self._in_flight else 0.0)


class PageReader:
    """An engine actor: the engine and an OcrService built from the batch's settings, on an event loop of
    its own (Ray Data's threads hand it batches; the engine's tasks never wait on Ray's queues). At most
    ``max_concurrency`` pages are read at once, as the server admits them."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import ray

        from ..config import Settings

        self.settings = Settings(**settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="hyocr-engine", daemon=True)
        self.thread.start()
        self.rendered = RenderedPages()
        self.meter = Meter()
        started = time.monotonic()
        self.service: Any = None
        self._on_loop(self._start())
        self.start_s = time.monotonic() - started
        context = ray.get_runtime_context()
        self.worker, self.node = context.get_actor_id() or "", ray.util.get_node_ip_address()

    def _on_loop(self, work: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    async def _start(self) -> None:
        from ..engines.registry import create_engine
        from ..pipeline.service import OcrService

        engine = create_engine(self.settings)
        service = OcrService.from_settings(engine, self.settings)
        service.inputs.pdf.close()  # its own renderer never starts: the pages come rendered
        service.inputs.pdf = self.rendered
        await engine.start()
        self.service, self.slots = service, asyncio.Semaphore(self.settings.max_concurrency)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pylist()
        outcomes = self._on_loop(self._read_all(rows))
        busy = self.meter.busy()
        return pa.Table.from_pylist([
            {"key": r["key"], "position": r["position"], "total": r["total"], "error": r["error"],
             "render_ms": r["render_ms"], "outcome": pickle.dumps(o) if o is not None else b"",
             "worker": self.worker, "node": self.node, "worker_pages": self.meter.pages, "worker_busy_s": busy,
             "worker_start_s": self.start_s} for r, o in zip(rows, outcomes, strict=True)])

    async def _read_all(self, rows: list[dict[str, Any]]) -> list[PageOutcome | None]:
        return list(await asyncio.gather(*(self._read(r) for r in rows)))

    async def _read(self, row: dict[str, Any]) -> PageOutcome | None:
        if row["error"] is not None:  # the document failed before its pages: passed on to the driver
            return None
        async with self.slots:
            self.meter.enter()
            outcome = await self._outcome(row)  # a HyocrError becomes the outcome; anything else stops the run
            self.meter.leave(read=outcome.page is not None)
            return outcome

    async def _outcome(self, row: dict[str, Any]) -> PageOutcome:
        from ..batch.local import file_call
        from ..errors import GatewayTimeout, HyocrError
        from ..types import ReadDone, Started

        rendered: Rendered | None = pickle.loads(row["payload"]) if row["pdf"] else None
        data = self.rendered.hold(rendered) if rendered is not None else row["payload"]
        prep = result = None
        try:
            call = file_call(data, row["source"], json.loads(row["options"]))
            async with contextlib.aclosing(self.service.read(call)) as events:
                async for event in events:
                    if isinstance(event, Started):
                        prep = event.prep
                    elif isinstance(event, ReadDone):
                        result = event.result
        except HyocrError as exc:
            # As in-process: failing before the pages (the call itself) or the deadline fails the
            # document, as does the failure of its only page; a page of several becomes an error page.
            if prep is None or rendered is None or row["total"] == 1 or isinstance(exc, GatewayTimeout):
                return PageOutcome(None, public_message(exc))
            return PageOutcome(self._error_page(rendered.page, exc), None, prep.task, prep.requested_task,
                               prep.model, self.service.engine.info.name)
        finally:
            if rendered is not None:
                self.rendered.release(data)
        if result is None:
            return PageOutcome(None, "the read ended without a result")
        return PageOutcome(result.pages[0], None, result.task, result.requested_task, result.model, result.engine,
                           result.timings)

    @staticmethod
    def _error_page(page: PageImage, exc: HyocrError) -> PageResult:
        """``reading._failed``'s page: the others of the document are read."""
        from ..types import FinishReason, PageResult

        if not exc.public:
            log.error("page %d failed: %s: %s", page.index, type(exc).__name__, exc.message)
        message = exc.message if exc.public else "the engine failed on this page"
        return PageResult(page.index, page.width, page.height, "", finish_reason=FinishReason.ERROR,
                          error=message).read_from(page)

    def __del__(self) -> None:
        # Ray Data drops its actors gracefully when the dataset is done: stop the engine (vLLM's core
        # process with it) instead of leaving it to the process's end.
        service, self.service = getattr(self, "service", None), None
        if service is None:
            return
        try:
            service.close()
            self._on_loop(service.engine.stop(), timeout=60)
        except Exception:  # the actor is going away either way
            log.exception("stopping the engine failed")
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
