"""OcrService: the one place a request meets the engine.

    OcrCall (from a route, the web UI or the CLI)
      -> admission (503 at once when full, before any decoding), then the request deadline (504)
      -> resolve the task against what the engine can do; build the prompt (official HunyuanOCR prompts)
      -> media: URLs fetched, PDFs rendered, images decoded within the memory budget (inputs.py)
      -> the engine, one request per page (reading.py) or one for the chat's text (chat.py), each watched
         by the stall watchdog and the loop guard (engine_run.py)
      -> each page post-processed into structure (pages.py)

Two public streams, both admitted and timed the same way: ``read`` yields ``Started`` (the prepared
call, so a caller can answer its HTTP errors before anything streams), pages as they finish (with their
text as it streams when asked), and the whole result; ``chat`` yields ``Started``, the text and its end.
Closing a stream (a client gone, a Stop button) aborts the engine's work and frees the admission slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from ..engines.base import Engine, structured_refusal
from ..engines.registry import engines_for
from ..errors import GatewayTimeout, InvalidRequest, UnsupportedTask
from ..hunyuan.prompts import V15_TASKS, build_prompt, refuse_reserved_tokens
from ..observability.logs import record
from ..types import (
    ChatEvent,
    MediaInput,
    OcrCall,
    OcrResult,
    Prepared,
    ReadDone,
    ReadEvent,
    Started,
    Task,
)
from .admission import Admission
from .chat import chat_text
from .engine_run import EngineRun
from .fetch import FetchPolicy
from .inputs import PageLoader, PageRequest, Preview
from .media import MediaLimits
from .memory import MemoryPolicy
from .pdf import PdfRenderer, RenderPlan
from .progress import ProgressBoard
from .reading import read_pages


@dataclass(frozen=True, slots=True)
class Surveyed:
    """A call checked to be read later (``OcrService.survey``): its media as bytes, its pages counted."""

    call: OcrCall
    pdf: bool
    pages: int  # the images, or the PDF's page count (before a pages= selection)
    task: Task
    requested_task: Task
    model: str


class OcrService:
    """Reads calls: ``read`` (pages and a structured result) and ``chat`` (the OpenAI routes' text)."""

    def __init__(
        self,
        engine: Engine,
        *,
        limits: MediaLimits | None = None,
        max_images: int = 8,
        default_max_tokens: int = 4096,
        prompt_language: str = "zh",
        loop_guard: bool = True,
        admission: Admission | None = None,
        request_timeout: float = 300.0,
        fetch_policy: FetchPolicy | None = None,
        max_pages: int = 64,
        pdf: PdfRenderer | None = None,
        pdf_plan: RenderPlan | None = None,
        stall_timeout: float = 120.0,
        memory: MemoryPolicy | None = None,
    ) -> None:
        self.engine = engine
        self.max_images = max_images
        self.default_max_tokens = default_max_tokens
        self.prompt_language = prompt_language
        self.loop_guard = loop_guard
        self.admission = admission or Admission(max_concurrency=64, max_queue=256)
        self.request_timeout = request_timeout
        self.inputs = PageLoader(limits or MediaLimits(), fetch_policy or FetchPolicy(()), pdf or PdfRenderer(),
                                 pdf_plan or RenderPlan.for_engine(engine.info.follows_prompts), max_pages,
                                 memory or MemoryPolicy.for_engine(engine.info.follows_prompts))
        self.progress = ProgressBoard(stall_timeout)  # each engine request's progress (the stall watchdog)
        self._run = EngineRun(engine, self.progress, loop_guard=loop_guard, default_max_tokens=default_max_tokens)

    @classmethod
    def from_settings(cls, engine: Engine, settings) -> OcrService:
        return cls(
            engine,
            limits=MediaLimits.from_settings(settings),
            max_images=settings.max_images_per_request,
            default_max_tokens=settings.default_max_tokens,
            prompt_language=settings.prompt_language,
            loop_guard=settings.loop_guard,
            admission=Admission(settings.max_concurrency, settings.max_queue, settings.queue_timeout),
            request_timeout=settings.request_timeout,
            fetch_policy=FetchPolicy.from_settings(settings),
            max_pages=settings.max_pages,
            pdf=PdfRenderer(workers=settings.pdf_workers, timeout=settings.pdf_render_timeout,
                            memory_mb=settings.pdf_worker_memory_mb),
            pdf_plan=RenderPlan.for_engine(engine.info.follows_prompts, settings),
            stall_timeout=settings.stall_timeout,
            memory=MemoryPolicy.for_engine(engine.info.follows_prompts, settings),
        )

    @property
    def model(self) -> str:
        return self.engine.info.model

    @property
    def max_pages(self) -> int:
        return self.inputs.max_pages

    def close(self) -> None:
        """Release what outlives requests (the PDF render workers). The engine is the caller's."""
        self.inputs.pdf.close()

    # ----------------------------------------------------------------- the public streams

    def read(self, call: OcrCall, *, request_id: str | None = None, deltas: bool = False,
             caller: str | None = None) -> AsyncIterator[ReadEvent]:
        """``Started``, then a ``PageRead`` per page as it finishes (preceded by its ``PageText``s, pages
        one after another, with ``deltas``), then ``ReadDone``. ``caller``: whose turn in the admission queue
        this is (the gateway's principal; None: anonymous)."""
        return self._admitted_stream(call, request_id, lambda prep: read_pages(self._run, prep, deltas=deltas),
                                     caller)

    def chat(self, call: OcrCall, *, request_id: str | None = None, whole: bool = False,
             caller: str | None = None) -> AsyncIterator[ChatEvent]:
        """``Started``, then the text as ``ChatText``s (or, ``whole``, none), then ``ChatDone``."""
        return self._admitted_stream(call, request_id, lambda prep: chat_text(self._run, prep, whole=whole),
                                     caller)

    async def _admitted_stream(self, call: OcrCall, request_id: str | None,
                               work: Callable[[Prepared], AsyncIterator], caller: str | None) -> AsyncIterator:
        """The one shape of both streams: admitted, prepared before the deadline, ``Started``, then
        ``work``'s events until the deadline."""
        async with self._admitted(caller) as deadline:
            prep = await self._before(deadline, self._prepare(call, request_id))
            yield Started(prep)
            async with contextlib.aclosing(self._until(work(prep), deadline)) as events:
                async for event in events:  # closed with this stream: the engine's work is aborted now
                    yield event

    async def preview(self, media: tuple[MediaInput, ...]) -> Preview:
        """The first page of ``media`` and how many there are, checked as a read would check them (the web
        UI shows it on upload). Not admitted: it decodes one page within the memory budget."""
        self._check_count(media)
        return await self.inputs.preview(media)

    async def survey(self, call: OcrCall) -> Surveyed:
        """``call`` checked for reading later (a job): the task resolved, its media fetched and decoded to
        bytes, the pages counted. Not admitted: it decodes one page, as ``preview`` does."""
        self._check_count(call.media)
        task, requested = self.resolve_task(call)
        survey = await self.inputs.survey(call.media, call.accept_pdf)
        if call.pages is not None and not survey.pdf:
            raise InvalidRequest("pages selects pages of a PDF; this request has images", param="pages")
        model = call.model if call.model in self.engine.info.adapters else self.model
        return Surveyed(replace(call, media=survey.media), survey.pdf, survey.pages, task, requested, model)

    # ----------------------------------------------------------------- admission and the deadline

    @contextlib.asynccontextmanager
    async def _admitted(self, caller: str | None):
        """An engine slot for the whole call (503 at once when full); yields the call's deadline."""
        ticket = await self.admission.acquire(caller)
        try:
            yield asyncio.get_running_loop().time() + self.request_timeout
        finally:
            ticket.release()

    def _late(self) -> GatewayTimeout:
        return GatewayTimeout(f"the request took longer than {self.request_timeout:g}s")

    async def _before(self, deadline: float, work):
        try:
            async with asyncio.timeout_at(deadline):
                return await work
        except TimeoutError:
            raise self._late() from None

    async def _until(self, events: AsyncIterator, deadline: float) -> AsyncIterator:
        """``events`` until ``deadline`` (event-loop time); then 504, and closing the stream aborts the
        engine's work. Each wait is bounded, so a hung engine cannot outlive the deadline."""
        try:
            while True:
                try:
                    # In this task, not wait_for's own (Python 3.11): a cancelled wait (client gone) then
                    # ends ``events`` here instead of leaving it running, which aclose() cannot close.
                    async with asyncio.timeout_at(deadline):
                        event = await anext(events)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise self._late() from None
                yield event
        finally:
            await events.aclose()

    # ----------------------------------------------------------------- preparation

    def _check_count(self, media: tuple[MediaInput, ...]) -> None:
        if not media:
            raise InvalidRequest("an image is required", param="image", code="missing_image")
        if len(media) > self.max_images:
            raise InvalidRequest(f"{len(media)} images given; at most {self.max_images} per request", param="image")

    def resolve_task(self, call: OcrCall) -> tuple[Task, Task]:
        """(task that will run, task that was asked). Raises UnsupportedTask for strict calls, and
        ``structured_refusal``'s error for an output constraint the engine cannot keep (a 400, or a 503 where
        its start-up check turned structured outputs off)."""
        refuse_reserved_tokens([("prompt", call.prompt), ("system", call.system), ("question", call.question),
                                *(("fields", field) for field in call.fields)])
        if call.sampling.structured is not None and not self.engine.info.structured:
            raise structured_refusal(self.engine.info, "schema" if call.strict_task else "response_format")
        requested = call.task
        if self.engine.supports(requested):
            return requested, requested
        if call.strict_task and self.engine.info.follows_prompts and requested in V15_TASKS:
            raise UnsupportedTask(f"task {requested.value!r} is HunyuanOCR 1.5's; this server runs HunyuanOCR "
                                  f"{self.engine.info.version or '1.0'}", param="task")
        if call.strict_task:
            able = ", ".join(engines_for(requested)) or "none installed"
            raise UnsupportedTask(
                f"task {requested.value!r} needs a vision-language engine ({able}); "
                f"the {self.engine.info.name} engine runs: "
                + ", ".join(sorted(t.value for t in self.engine.info.tasks)),
                param="task",
            )
        return Task.TEXT, requested

    async def _prepare(self, call: OcrCall, request_id: str | None) -> Prepared:
        self._check_count(call.media)
        task, requested = self.resolve_task(call)
        if call.prompt is not None and self.engine.info.follows_prompts:
            prompt = call.prompt
        elif task is not requested:  # the engine reads text whatever was asked
            prompt = build_prompt(task, prompt_language=call.prompt_language or self.prompt_language)
        else:
            prompt = build_prompt(
                task,
                fields=call.fields,
                target_language=call.target_language,
                question=call.question,
                prompt_language=call.prompt_language or self.prompt_language,
                version=self.engine.info.version,
            )
        started = time.perf_counter()
        how = PageRequest(call.accept_pdf, call.pages, call.prefer_text_layer and task is Task.TEXT,
                          keep_error_pages=call.document_range)
        times: dict[str, float] = {}
        pages = await self.inputs.load(call.media, how, times)
        decode_ms = (time.perf_counter() - started) * 1000 - times.get("fetch_ms", 0.0)  # fetch: its own stage
        request_id = request_id or f"ocr-{uuid.uuid4().hex}"
        record(images=len(pages), image_bytes=sum(p.source_bytes for p in pages), engine_request=request_id,
               image_pixels=sum(p.width * p.height for p in pages if p.error is None), task=task.value,
               decode_ms=round(decode_ms, 2))
        return Prepared(
            request_id=request_id,  # the engine's; the access log line pairs it with the X-Request-ID
            task=task,
            requested_task=requested,
            prompt=prompt,
            pages=pages,
            call=call,
            model=call.model if call.model in self.engine.info.adapters else self.model,
            decode_ms=decode_ms,
            fetch_ms=times.get("fetch_ms", 0.0),
        )


async def result_of(events: AsyncIterator[ReadEvent]) -> OcrResult:
    """A read's whole result (for a caller that wants no events); the stream is closed either way."""
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, ReadDone):
                return event.result
    raise AssertionError("a read ends with ReadDone")
