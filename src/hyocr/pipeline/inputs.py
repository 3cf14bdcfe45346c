"""What a request brought -> validated page images.

    MediaInput (bytes, base64 / data URL, or an http(s) URL when the server allows them)
      -> URLs fetched (SSRF-safe), base64 decoded with its size checked first
      -> one PDF (where the caller takes documents): rendered by the PDF workers, one page per selected page;
         one TIFF of several pages (a fax, a scanner's document): each selected page decoded as an image
      -> images: every header checked first (per image and per request), then each image decoded on a
         thread within the process's decode budget and reduced at once to what the engine keeps
         (pipeline/memory.py)
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

from PIL import Image

from ..errors import InvalidRequest, PayloadTooLarge
from ..observability.logs import record
from ..observability.tracing import span
from ..types import MediaInput, PageImage
from .fetch import FetchPolicy, fetch_image
from .encoded import decode_base64
from .media import (
    ImageProbe,
    MediaLimits,
    check_pdf_size,
    check_request_pixels,
    decode_cost,
    decode_image,
    frame_probe,
    is_document,
    is_pdf,
    probe_image,
    reduction_for,
)
from .memory import MemoryPolicy, decoded_within, tune_allocator
from .pdf import PdfRenderer, RenderPlan
from .pdf_worker import parse_pages
from .tiff import tiff_page_frames


@dataclass(frozen=True, slots=True)
class Preview:
    """The first page of what was sent, and how much there is (``PageLoader.preview``)."""

    first: PageImage
    images: int  # images sent (1 for a PDF)
    pdf: bool  # a document: a PDF, or a TIFF of several pages (its pages selected and read as a PDF's)
    pages: int  # pages to read: the images, or the document's page count


@dataclass(frozen=True, slots=True)
class Survey:
    """What was sent, ready to be read later (``PageLoader.survey``): raw bytes, and how many pages."""

    media: tuple[MediaInput, ...]  # as bytes: URLs fetched, base64 decoded
    pdf: bool  # a document (Preview.pdf)
    pages: int  # the images, or the document's page count


@dataclass(frozen=True, slots=True)
class PageRequest:
    """How the caller wants documents read (only /v1/ocr, the UI and the CLI take PDFs)."""

    accept_pdf: bool = False
    pages: str | None = None  # "2-5,8" of a PDF (1-based); None: all
    text_layer: bool = False  # a PDF page's own text, when reliable, instead of OCR
    keep_error_pages: bool = False  # OcrCall.document_range: pages that fail are error pages, all of them too


class PageLoader:
    def __init__(self, limits: MediaLimits, fetch_policy: FetchPolicy, pdf: PdfRenderer, pdf_plan: RenderPlan,
                 max_pages: int, memory: MemoryPolicy | None = None) -> None:
        self.limits = limits
        self.fetch_policy = fetch_policy
        self.pdf = pdf  # worker processes start on the first PDF
        self.pdf_plan = pdf_plan
        self.max_pages = max_pages
        # Without a policy (a loader built on its own) images are kept as decoded, unbudgeted; the service
        # passes the engine's (OcrService.from_settings).
        self.memory = memory or MemoryPolicy()
        if memory is not None and memory.budget is not None:
            tune_allocator()

    async def load(self, media: tuple[MediaInput, ...], how: PageRequest,
                   timings: dict[str, float] | None = None) -> tuple[PageImage, ...]:
        """The request's pages; ``timings`` (when given) gets ``fetch_ms``, the time spent fetching URLs."""
        if any(m.url for m in media):
            started = time.perf_counter()
            with span("hyocr.fetch", images=sum(m.url for m in media)):
                fetched = await asyncio.gather(*(
                    fetch_image(m.data, self.fetch_policy, param=m.param) if m.url else _same(m.data)
                    for m in media
                ))
            fetch_ms = round((time.perf_counter() - started) * 1000, 2)
            record(fetch_ms=fetch_ms)
            if timings is not None:
                timings["fetch_ms"] = fetch_ms
            media = tuple(MediaInput(data, m.param) for data, m in zip(fetched, media, strict=True))
        with span("hyocr.decode", images=len(media)):
            if how.accept_pdf and len(media) == 1:
                item = media[0]
                raw = item.data if isinstance(item.data, bytes) else await asyncio.to_thread(
                    decode_base64, item.data, self.limits, param=item.param, accept_pdf=True)
                if is_pdf(raw):
                    return await self._pdf_pages(raw, how, item.param)
                frames = await asyncio.to_thread(tiff_page_frames, raw)
                if len(frames) > 1:
                    return await self._tiff_pages(raw, frames, how.pages, item.param)
                media = (MediaInput(raw, item.param),)
            probes = await asyncio.to_thread(self._probe_all, media, how.accept_pdf)  # what is not an image says so
            if how.pages is not None:
                raise InvalidRequest("pages selects pages of a PDF; this request has images", param="pages")
            return await self._decode_all(probes)

    async def _tiff_pages(self, raw: bytes, frames: tuple[int, ...], pages: str | None, param: str
                          ) -> tuple[PageImage, ...]:
        """The selected pages of a TIFF document (``pages`` as a PDF's, up to ``max_pages``), each an image
        held to the image caps and decoded within the budget; ``index`` is the page's, as a PDF page's."""
        chosen = parse_pages(pages, len(frames), self.max_pages)
        first = await asyncio.to_thread(probe_image, raw, self.limits, index=chosen[0], param=param,
                                        frame=frames[chosen[0]])
        image, left, read = first.image, self.pdf_plan.max_total_pixels, []
        record(tiff_pages=len(frames))
        for i in chosen:  # one at a time, in page order: one Image, sought forward, decoded before the next
            probe = first if i == chosen[0] else await asyncio.to_thread(
                frame_probe, image, len(raw), self.limits, frame=frames[i], index=i, param=param)
            if left is not None and (left := left - probe.pixels) < 0:  # as a PDF's MAX_DOCUMENT_PIXELS
                raise PayloadTooLarge(f"the selected pages of this TIFF are more than {self.pdf_plan.max_total_pixels}"
                                      " pixels together: select fewer with pages", param=param, code="too_many_pixels")
            (page,) = await self._decode_all([probe])
            if page.image is image:  # the next seek would change it
                page = replace(page, image=image.copy())
            read.append(replace(page, source="image"))
        return tuple(read)

    async def _pdf_pages(self, raw: bytes, how: PageRequest, param: str) -> tuple[PageImage, ...]:
        check_pdf_size(raw, self.limits, param=param)
        plan = replace(self.pdf_plan, pages=how.pages, max_pages=self.max_pages, text_layer=how.text_layer,
                       keep_error_pages=how.keep_error_pages)
        document = await self.pdf.render(raw, plan, param=param)
        record(pdf_bytes=len(raw), pdf_pages=document.page_count)
        pages = document.pages
        # Rendered at the engine's DPI already; only a detector's giant page (rendered up to the image pixel
        # cap) is larger than what the engine reads: reduce it, as an image would be.
        if any(p.image is not None and self.memory.keep.target(*p.image.size) for p in pages):
            pages = await asyncio.to_thread(lambda: tuple(self._reduced(p) for p in pages))
        return pages

    async def preview(self, media: tuple[MediaInput, ...], *, document: bool = False) -> Preview:
        """What a read of ``media`` would find, checked by the same rules (limits, decoder, renderer), at
        the cost of one page: every image's header, and the first page decoded (or rendered). ``document``:
        only the document matters (a survey), so a first page that cannot be rendered is its error page, not
        the document's refusal: a selection may leave it out, and a read makes it an error page anyway."""
        first = media[0]
        raw = first.data if isinstance(first.data, bytes) else await asyncio.to_thread(
            decode_base64, first.data, self.limits, param=first.param, accept_pdf=True)
        if is_pdf(raw):
            if len(media) > 1:
                raise InvalidRequest("a PDF is read on its own: upload one PDF, or images", param=first.param)
            check_pdf_size(raw, self.limits, param=first.param)
            plan = replace(self.pdf_plan, pages="1", max_pages=1, keep_error_pages=document)
            document = await self.pdf.render(raw, plan, param=first.param)
            return Preview(document.pages[0], 1, True, document.page_count)
        frames = await asyncio.to_thread(tiff_page_frames, raw)
        if len(frames) > 1 and len(media) == 1:  # a TIFF document: counted as a PDF's pages are
            (page,) = await self._tiff_pages(raw, frames, "1", first.param)
            return Preview(page, 1, True, len(frames))
        probes = await asyncio.to_thread(self._probe_all, (MediaInput(raw, first.param), *media[1:]), True)
        (page,) = await self._decode_all(probes[:1])
        return Preview(page, len(probes), False, len(probes))

    async def survey(self, media: tuple[MediaInput, ...], accept_pdf: bool) -> Survey:
        """What a read of ``media`` will find, for work stored to run later (the jobs): URLs fetched and
        base64 decoded once (so a later read needs neither), every image's header checked and a PDF opened
        (its first page rendered), by the rules a read applies."""
        raws = []
        for m in media:
            if m.url:
                raws.append(await fetch_image(m.data, self.fetch_policy, param=m.param))
            elif isinstance(m.data, str):
                raws.append(await asyncio.to_thread(
                    decode_base64, m.data, self.limits, param=m.param, accept_pdf=accept_pdf))
            else:
                raws.append(m.data)
        plain = tuple(MediaInput(raw, m.param) for raw, m in zip(raws, media, strict=True))
        found = await self.preview(plain, document=True) if accept_pdf or not any(map(is_document, raws)) else None
        if found is not None and found.pdf and found.pages == 1 and found.first.error is not None:
            await self.preview(plain)  # a document of one page that cannot be rendered: refused now, saying why
        if found is None:
            await asyncio.to_thread(self._probe_all, plain, False)  # raises: a document where none is taken
        return Survey(plain, found is not None and found.pdf, found.pages if found else len(plain))

    def _reduced(self, page: PageImage) -> PageImage:
        target = self.memory.keep.target(*page.image.size) if page.image is not None else None
        if target is None:
            return page
        image = page.image.resize(target, Image.Resampling.BICUBIC)
        return replace(page, image=image, size=(page.width, page.height))

    def _probe_all(self, media: tuple[MediaInput, ...], accept_pdf: bool) -> list[ImageProbe]:
        """Every image's bytes and header checked, and their pixels together, before any is decoded."""
        probes = []
        for i, item in enumerate(media):
            raw = item.data if isinstance(item.data, bytes) else decode_base64(item.data, self.limits,
                                                                                 param=item.param)
            if accept_pdf and is_pdf(raw):
                raise InvalidRequest("a PDF is read on its own: send one document per request, without other "
                                     "files", param=item.param)
            probes.append(probe_image(raw, self.limits, index=i, param=item.param, accept_pdf=accept_pdf))
        check_request_pixels(probes, self.limits)
        return probes

    async def _decode_all(self, probes: list[ImageProbe]) -> tuple[PageImage, ...]:
        """One image at a time, each within the decode budget for as long as it is at full size."""
        pages = []
        for probe in probes:
            stored = reduction_for(probe, self.memory.keep)
            cost = decode_cost(probe, stored)
            pages.append(await decoded_within(self.memory.budget, cost, decode_image, probe, stored))
        return tuple(pages)


async def _same(value: bytes | str) -> bytes | str:
    return value
