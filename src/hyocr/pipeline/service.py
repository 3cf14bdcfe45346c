"""OcrService: the one place a request meets the engine.

    OcrCall (from a route or the CLI)
      -> resolve the task against what the engine can do
      -> decode and validate media (off the event loop)
      -> build the prompt (official HunyuanOCR prompts)
      -> engine.generate(...) per page, concurrently, under the loop guard
      -> post-process each page into structure

Routes stay thin: they turn wire models into an ``OcrCall`` and render what comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from ..engines.base import Engine
from ..engines.registry import engines_for
from ..errors import GatewayTimeout, HyocrError, InvalidRequest, UnsupportedTask
from ..observability.logs import record, record_first
from ..observability.tracing import span
from ..types import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    OcrResult,
    PageImage,
    PageResult,
    SamplingParams,
    Task,
    TextBlock,
    Usage,
)
from . import postprocess
from .admission import Admission, Ticket
from .fetch import FetchPolicy
from .inputs import MediaInput, PageLoader, PageRequest
from .media import MediaLimits
from .memory import MemoryPolicy
from .pages import build_page, cut_loops
from .pdf import PdfRenderer, RenderPlan, page_without_engine
from .progress import ProgressBoard
from .tasks import build_prompt


@dataclass(frozen=True, slots=True)
class OcrCall:
    """Everything one request asks for. Immutable; built by a route or the CLI."""

    media: tuple[MediaInput, ...]
    task: Task = Task.TEXT
    fields: tuple[str, ...] = ()
    single_key: bool = False  # "输出 Key 的值。": the model answers with the bare value, not JSON
    target_language: str = "en"
    question: str | None = None
    prompt_language: str | None = None
    # Chat clients send their own prompt text: an engine that follows prompts gets it verbatim.
    prompt: str | None = None
    system: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None  # the client's model name: selects a LoRA adapter when it names one
    # /v1/ocr asks for a task explicitly (unsupported -> 400); chat clients get the closest task
    # the engine can run (text) and are told which one ran.
    strict_task: bool = True
    # PDF documents, where the caller takes them (/v1/ocr, the UI, the CLI; chat routes take images)
    accept_pdf: bool = False
    pages: str | None = None  # "2-5,8": the PDF pages to read (1-based); None: all
    prefer_text_layer: bool = False  # task text: a PDF page's own text, when reliable, instead of OCR


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated call: the task that will run, its prompt, and decoded pages."""

    request_id: str
    task: Task
    requested_task: Task
    prompt: str
    pages: tuple[PageImage, ...]
    call: OcrCall
    decode_ms: float
    fetch_ms: float = 0.0  # image URLs fetched (before decoding)


class OcrService:
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

    def model_for(self, prep: Prepared) -> str:
        """The name responses carry: the adapter's when the request selected one."""
        return prep.call.model if prep.call.model in self.engine.info.adapters else self.model

    # ----------------------------------------------------------------- entry points
    # Each one: admission (503 at once when full, before any decoding) -> prepare -> engine work
    # under the request deadline (504, engine work aborted) -> the slot released however it ends.

    async def ocr(self, call: OcrCall, *, request_id: str | None = None) -> OcrResult:
        async with await self.admission.acquire():
            return await self._within_deadline(self._prepare_and_run(call, request_id))

    async def _prepare_and_run(self, call: OcrCall, request_id: str | None) -> OcrResult:
        return await self.run(await self.prepare(call, request_id=request_id))

    async def generate_text(self, call: OcrCall, *, request_id: str) -> tuple[Prepared, str, EngineChunk]:
        async with await self.admission.acquire():
            return await self._within_deadline(self._prepare_and_complete(call, request_id))

    async def _prepare_and_complete(self, call: OcrCall, request_id: str) -> tuple[Prepared, str, EngineChunk]:
        prep = await self.prepare(call, request_id=request_id)
        text, final = await self.complete(prep)
        return prep, text, final

    async def open_stream(
        self, call: OcrCall, *, request_id: str
    ) -> tuple[Prepared, AsyncIterator[EngineChunk]]:
        """Admit and validate now (so errors are plain HTTP errors), stream later."""
        ticket = await self.admission.acquire()
        try:
            prep = await self.prepare(call, request_id=request_id)
        except BaseException:
            ticket.release()
            raise
        return prep, self._deadline_stream(prep, ticket)

    async def _within_deadline(self, work):
        try:
            return await asyncio.wait_for(work, self.request_timeout)
        except TimeoutError:
            raise GatewayTimeout(f"the request took longer than {self.request_timeout:g}s") from None

    async def _deadline_stream(self, prep: Prepared, ticket: Ticket) -> AsyncIterator[EngineChunk]:
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        try:
            async for chunk in self.until_deadline(self.stream(prep), deadline):
                if chunk.finish_reason is not None:
                    record(prompt_tokens=chunk.prompt_tokens, output_tokens=chunk.completion_tokens,
                           finish_reason=chunk.finish_reason.value,
                           repetition_stops=int(chunk.finish_reason is FinishReason.REPETITION))
                yield chunk
        finally:
            ticket.release()

    async def until_deadline(self, chunks: AsyncIterator[EngineChunk], deadline: float) -> AsyncIterator[EngineChunk]:
        """``chunks`` until ``deadline`` (event-loop time); then 504, and closing the stream aborts the
        engine's work. Each wait is bounded, so a hung engine cannot outlive the deadline."""
        try:
            while True:
                try:
                    # In this task, not wait_for's own (Python 3.11): a cancelled wait (client gone) then
                    # ends ``chunks`` here instead of leaving it running, which aclose() cannot close.
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise GatewayTimeout(f"the request took longer than {self.request_timeout:g}s") from None
                yield chunk
        finally:
            await chunks.aclose()

    # ----------------------------------------------------------------- preparation

    def resolve_task(self, call: OcrCall) -> tuple[Task, Task]:
        """(task that will run, task that was asked). Raises UnsupportedTask for strict calls."""
        requested = call.task
        if self.engine.supports(requested):
            return requested, requested
        if call.strict_task:
            able = ", ".join(engines_for(requested)) or "none installed"
            raise UnsupportedTask(
                f"task {requested.value!r} needs a vision-language engine ({able}); "
                f"the {self.engine.info.name} engine runs: "
                + ", ".join(sorted(t.value for t in self.engine.info.tasks)),
                param="task",
            )
        return Task.TEXT, requested

    async def prepare(self, call: OcrCall, *, request_id: str | None = None) -> Prepared:
        if not call.media:
            raise InvalidRequest("an image is required", param="image")
        if len(call.media) > self.max_images:
            raise InvalidRequest(
                f"{len(call.media)} images given; at most {self.max_images} per request",
                param="image",
            )
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
            )
        started = time.perf_counter()
        how = PageRequest(call.accept_pdf, call.pages, call.prefer_text_layer and task is Task.TEXT)
        times: dict[str, float] = {}
        pages = await self.inputs.load(call.media, how, times)
        decode_ms = (time.perf_counter() - started) * 1000 - times.get("fetch_ms", 0.0)  # fetch: its own stage
        record(images=len(pages), image_bytes=sum(p.source_bytes for p in pages),
               image_pixels=sum(p.width * p.height for p in pages), task=task.value,
               decode_ms=round(decode_ms, 2))
        return Prepared(
            request_id=request_id or f"ocr-{uuid.uuid4().hex}",
            task=task,
            requested_task=requested,
            prompt=prompt,
            pages=pages,
            call=call,
            decode_ms=decode_ms,
            fetch_ms=times.get("fetch_ms", 0.0),
        )

    def _sampling(self, call: OcrCall) -> SamplingParams:
        if call.sampling.max_tokens is None:
            return replace(call.sampling, max_tokens=self.default_max_tokens)
        return call.sampling

    def _engine_request(self, prep: Prepared, images: tuple[PageImage, ...], suffix: str = "") -> EngineRequest:
        return EngineRequest(
            request_id=prep.request_id + suffix,
            task=prep.task,
            prompt=prep.prompt,
            images=images,
            system=prep.call.system,
            sampling=self._sampling(prep.call),
            adapter=prep.call.model if prep.call.model in self.engine.info.adapters else None,
        )

    # ----------------------------------------------------------------- streaming (chat)

    async def stream(self, prep: Prepared) -> AsyncIterator[EngineChunk]:
        """Text deltas for all pages of a chat request, then one final chunk.

        A model engine sees all images in one prompt (it may compare them); an engine that takes
        one image at a time reads them in order, separated by a blank line.
        """
        if len(prep.pages) <= self.engine.info.max_images:
            groups = [prep.pages]
        else:
            groups = [(p,) for p in prep.pages]
        usage = Usage()
        finish = FinishReason.STOP
        started = time.perf_counter()
        for n, group in enumerate(groups):
            last: EngineChunk | None = None
            first = True
            async for chunk in self._guarded(self._engine_request(prep, group, f"-{n}" if n else "")):
                if chunk.text or chunk.blocks:
                    text = chunk.text
                    if first and n:
                        text = "\n\n" + text
                    first = False
                    yield replace(chunk, text=text, finish_reason=None,
                                  prompt_tokens=usage.prompt_tokens + chunk.prompt_tokens,
                                  completion_tokens=usage.completion_tokens + chunk.completion_tokens)
                last = chunk
            if last is not None:
                usage = usage + Usage(last.prompt_tokens, last.completion_tokens)
                finish = last.finish_reason or FinishReason.STOP
            if finish is not FinishReason.STOP:
                break
        record(engine_ms=round((time.perf_counter() - started) * 1000, 2))
        yield EngineChunk(
            finish_reason=finish,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
        )

    async def complete(self, prep: Prepared) -> tuple[str, EngineChunk]:
        """A prompt run to the end: (text with any looping tail cut, the final chunk)."""
        parts: list[str] = []
        final = EngineChunk(finish_reason=FinishReason.STOP)
        async for chunk in self.stream(prep):
            parts.append(chunk.text)
            if chunk.finish_reason is not None:
                final = chunk
        text, finish = cut_loops(
            "".join(parts), final.finish_reason or FinishReason.STOP, self.engine.info.follows_prompts
        )
        record(prompt_tokens=final.prompt_tokens, output_tokens=final.completion_tokens, finish_reason=finish.value,
               repetition_stops=int(finish is FinishReason.REPETITION))
        return text, replace(final, finish_reason=finish)

    async def _guarded(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """The engine's stream under the loop guard: a repeating tail ends it with ``repetition``.

        Closing this generator (client gone, error) closes the engine's stream, which aborts the
        engine's work for the request.
        """
        wanted = self.loop_guard if request.sampling.loop_guard is None else request.sampling.loop_guard
        guard = postprocess.LoopGuard() if wanted and self.engine.info.follows_prompts else None
        started = time.perf_counter()
        watch = self.progress.enter(request.request_id, self.engine.expected_seconds(request))
        stream = self.engine.generate(request)
        try:
            while True:
                self.progress.wait(watch)
                try:
                    chunk = await anext(stream)
                except StopAsyncIteration:
                    break
                except asyncio.CancelledError:
                    if (failure := self.progress.failure_for(watch)) is None:
                        raise
                    raise failure from None
                self.progress.got(watch)
                if chunk.text or chunk.blocks:
                    record_first(ttft_s=time.perf_counter() - started)
                if guard is not None and chunk.text and guard.feed(chunk.text):
                    yield replace(chunk, finish_reason=None)
                    yield EngineChunk(
                        finish_reason=FinishReason.REPETITION,
                        prompt_tokens=chunk.prompt_tokens,
                        completion_tokens=chunk.completion_tokens,
                    )
                    return
                yield chunk
        finally:
            self.progress.leave(watch)
            await stream.aclose()
            await self.engine.abort(request.request_id)

    # ----------------------------------------------------------------- whole results (/v1/ocr)

    async def run(self, prep: Prepared) -> OcrResult:
        """Every page through the engine concurrently; results in page order."""
        async with contextlib.aclosing(self.run_pages(prep)) as items:
            async for item in items:
                if isinstance(item, OcrResult):
                    return item
        raise AssertionError("run_pages ends with the result")

    async def open_pages(
        self, call: OcrCall, *, request_id: str | None = None
    ) -> tuple[Prepared, AsyncIterator[PageResult | OcrResult]]:
        """/v1/ocr streaming: admit and prepare now (so errors are plain HTTP errors), then each page
        as it finishes and the whole result last, all within the request deadline."""
        ticket = await self.admission.acquire()
        deadline = asyncio.get_running_loop().time() + self.request_timeout
        try:
            prep = await self._within_deadline(self.prepare(call, request_id=request_id))
        except BaseException:
            ticket.release()
            raise
        return prep, self._pages_within(prep, ticket, deadline)

    async def _pages_within(
        self, prep: Prepared, ticket: Ticket, deadline: float
    ) -> AsyncIterator[PageResult | OcrResult]:
        try:
            async for item in self.until_deadline(self.run_pages(prep), deadline):  # type: ignore[arg-type]
                yield item
        finally:
            ticket.release()

    async def run_pages(self, prep: Prepared) -> AsyncIterator[PageResult | OcrResult]:
        """Every page through the engine concurrently (vLLM batches them): each ``PageResult`` as it
        finishes, then the ``OcrResult`` with the pages in page order. Closing it cancels the rest."""
        started = time.perf_counter()

        async def numbered(n: int, page: PageImage) -> tuple[int, PageResult, float]:
            return (n, *await self._run_page(prep, page))

        tasks = [asyncio.ensure_future(numbered(n, page)) for n, page in enumerate(prep.pages)]
        pages: list[tuple[int, PageResult, float]] = []
        try:
            for finished in asyncio.as_completed(tasks):
                pages.append(await finished)
                yield pages[-1][1]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        engine_done = time.perf_counter()
        pages.sort(key=lambda item: item[0])
        results = tuple(r for _, r, _ in pages)
        post_ms = sum(ms for _, _, ms in pages)
        usage = Usage()
        for r in results:
            usage = usage + r.usage
        timings = {
            "decode_ms": round(prep.decode_ms, 2),
            "engine_ms": round((engine_done - started) * 1000 - post_ms, 2),
            "postprocess_ms": round(post_ms, 2),
            "total_ms": round(prep.fetch_ms + prep.decode_ms + (engine_done - started) * 1000, 2),
        }
        record(prompt_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
               repetition_stops=sum(r.finish_reason is FinishReason.REPETITION for r in results),
               engine_ms=timings["engine_ms"], postprocess_ms=timings["postprocess_ms"])
        yield OcrResult(
            id=prep.request_id,
            model=self.model_for(prep),
            engine=self.engine.info.name,
            task=prep.task,
            requested_task=prep.requested_task,
            pages=results,
            usage=usage,
            timings=timings,
        )

    async def _run_page(self, prep: Prepared, page: PageImage) -> tuple[PageResult, float]:
        if not page.needs_engine:  # a PDF page read from its text layer, or one that could not be rendered
            return page_without_engine(page), 0.0
        request = self._engine_request(prep, (page,), f"-p{page.index}" if len(prep.pages) > 1 else "")
        parts: list[str] = []
        blocks: list[TextBlock] = []
        last = EngineChunk()
        try:
            with span("hyocr.engine", request_id=request.request_id, page=page.index, task=prep.task.value):
                async for chunk in self._guarded(request):
                    parts.append(chunk.text)
                    blocks.extend(chunk.blocks)
                    last = chunk
        except HyocrError as exc:
            if len(prep.pages) == 1:
                raise
            # One failed page does not fail the document.
            message = exc.message if exc.public else "the engine failed on this page"
            failed = PageResult(page.index, page.width, page.height, "", finish_reason=FinishReason.ERROR,
                                error=message)
            return failed.read_from(page), 0.0
        t0 = time.perf_counter()
        with span("hyocr.postprocess", page=page.index):
            result = build_page(
                prep.task,
                page,
                "".join(parts),
                tuple(blocks),
                last.finish_reason or FinishReason.STOP,
                Usage(last.prompt_tokens, last.completion_tokens),
                prep.call.fields,
                trim_loops=self.engine.info.follows_prompts,
                single_key=prep.call.single_key,
            ).read_from(page)
        return result, (time.perf_counter() - t0) * 1000

