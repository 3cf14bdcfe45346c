"""What a request brought -> validated page images.

    MediaInput (bytes, base64 / data URL, or an http(s) URL when the server allows them)
      -> URLs fetched (SSRF-safe), base64 decoded with its size checked first
      -> one PDF (where the caller takes documents): rendered by the PDF workers, one page per selected page
      -> images: decoded and validated on a thread
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from ..errors import InvalidRequest
from ..observability.logs import record
from ..observability.tracing import span
from ..types import PageImage
from .fetch import FetchPolicy, fetch_image
from .media import MediaLimits, check_pdf_size, decode_base64, is_pdf, load_image
from .pdf import PdfRenderer, RenderPlan


@dataclass(frozen=True, slots=True)
class MediaInput:
    """One image or document as it arrived: raw bytes (upload) or a base64 / data-URL string."""

    data: bytes | str
    param: str = "image"  # where it came from, for error messages
    url: bool = False  # data is an http(s) URL to fetch (only when the server allows URLs)


@dataclass(frozen=True, slots=True)
class PageRequest:
    """How the caller wants documents read (only /v1/ocr, the UI and the CLI take PDFs)."""

    accept_pdf: bool = False
    pages: str | None = None  # "2-5,8" of a PDF (1-based); None: all
    text_layer: bool = False  # a PDF page's own text, when reliable, instead of OCR


class PageLoader:
    def __init__(self, limits: MediaLimits, fetch_policy: FetchPolicy, pdf: PdfRenderer, pdf_plan: RenderPlan,
                 max_pages: int) -> None:
        self.limits = limits
        self.fetch_policy = fetch_policy
        self.pdf = pdf  # worker processes start on the first PDF
        self.pdf_plan = pdf_plan
        self.max_pages = max_pages

    async def load(self, media: tuple[MediaInput, ...], how: PageRequest) -> tuple[PageImage, ...]:
        if any(m.url for m in media):
            with span("hyocr.fetch", images=sum(m.url for m in media)):
                fetched = await asyncio.gather(*(
                    fetch_image(m.data, self.fetch_policy, param=m.param) if m.url else _same(m.data)
                    for m in media
                ))
            media = tuple(MediaInput(data, m.param) for data, m in zip(fetched, media, strict=True))
        with span("hyocr.decode", images=len(media)):
            if how.accept_pdf and len(media) == 1:
                item = media[0]
                raw = item.data if isinstance(item.data, bytes) else await asyncio.to_thread(
                    decode_base64, item.data, self.limits, param=item.param,
                    max_bytes=max(self.limits.max_image_bytes, self.limits.max_pdf_bytes))
                if is_pdf(raw):
                    return await self._render(raw, how, item.param)
                media = (MediaInput(raw, item.param),)
            if how.pages is not None:
                raise InvalidRequest("pages selects pages of a PDF; this request has images", param="pages")
            return await asyncio.to_thread(self._decode_all, media, how.accept_pdf)

    async def _render(self, raw: bytes, how: PageRequest, param: str) -> tuple[PageImage, ...]:
        check_pdf_size(raw, self.limits, param=param)
        plan = replace(self.pdf_plan, pages=how.pages, max_pages=self.max_pages, text_layer=how.text_layer)
        document = await self.pdf.render(raw, plan, param=param)
        record(pdf_bytes=len(raw), pdf_pages=document.page_count)
        return document.pages

    def _decode_all(self, media: tuple[MediaInput, ...], accept_pdf: bool) -> tuple[PageImage, ...]:
        pages = []
        for i, item in enumerate(media):
            raw = item.data if isinstance(item.data, bytes) else decode_base64(item.data, self.limits, param=item.param)
            if accept_pdf and is_pdf(raw):
                raise InvalidRequest("a PDF is read on its own: send one document per request, without other "
                                     "files", param=item.param)
            pages.append(load_image(raw, self.limits, index=i, param=item.param))
        return tuple(pages)


async def _same(value: bytes | str) -> bytes | str:
    return value
