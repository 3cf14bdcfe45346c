"""``hyocr batch --ray``'s render side, run in Ray tasks (``flat_map``): each document read (a local path, or a
URI through the batch's ``Sources``) and checked against the hash the driver recorded; a PDF rendered by the
PdfRenderer
with the RenderPlan the in-process service makes for the engine, one row a page (``Rendered``); an image file
one row of its bytes (decoded by the engine actor); a document that cannot be read one row saying why.
``RenderedPages`` is the renderer the engine actor's service gets instead of its own: it hands back the pages
these tasks rendered. ``public_message`` is what a failed document's line says, on every side.

Ray is not imported here: these functions run inside Ray's tasks, and hyocr imports without Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..batch.sources import Sources
    from ..errors import HyocrError
    from ..pipeline.pdf import RenderPlan
    from ..types import PageImage

PLACEHOLDER = b"%PDF-1.7 hyocr: rendered by a Ray task, page "


def public_message(exc: HyocrError) -> str:
    """What a failed document's line says (as the in-process reader says it)."""
    return exc.message if exc.public else "internal error"


_RENDERER: Any = None  # one PdfRenderer per task process: its PDFium worker is started once, then reused


def _renderer(pdf: Mapping[str, Any]) -> Any:
    global _RENDERER
    from ..pipeline.pdf import PdfRenderer

    if _RENDERER is None:
        _RENDERER = PdfRenderer(**pdf)
    return _RENDERER


def render_document(row: dict[str, Any], *, plan: RenderPlan, limits: Any, max_pages: int,
                    pdf: Mapping[str, Any], sources: Sources | None = None) -> list[dict[str, Any]]:
    """A document's rows: one a page (an image file is one page: its bytes), or one saying why it failed.
    ``sources``: the driver's (its object store's endpoint and policy)."""
    from ..batch.sources import Sources
    from ..errors import HyocrError
    from ..pipeline.media import check_pdf_size

    try:
        data = (sources or Sources()).read(row["source"])
    except OSError as exc:
        return [_failure(row, exc.strerror or str(exc))]
    if hashlib.sha256(data).hexdigest() != row["sha256"]:
        return [_failure(row, "the file changed while the batch ran; run the batch again")]
    if not row["pdf"]:  # decoded by the engine actor's service, as in-process
        return [_page_row(row, 0, 1, data, 0.0)]
    started = time.perf_counter()
    try:  # as PageLoader._pdf_pages: the size checked, then the plan with this document's pages
        check_pdf_size(data, limits, param=row["source"])
        how = replace(plan, pages=row["pages"], max_pages=max_pages, text_layer=row["text_layer"])
        document = asyncio.run(_renderer(pdf).render(data, how, param=row["source"]))
    except HyocrError as exc:
        return [_failure(row, public_message(exc))]
    render_ms = (time.perf_counter() - started) * 1000
    pages = document.pages
    if not pages:  # in-process this reads as a body without pages; here it has no page to carry its read
        return [_failure(row, "the PDF has no pages")]
    return [_page_row(row, n, len(pages), pickle.dumps(Rendered(page, document.page_count)),
                      render_ms if n == 0 else 0.0) for n, page in enumerate(pages)]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered PDF page on its way to an engine actor (PIL images pickle with their pixels)."""

    page: PageImage
    page_count: int  # pages in the whole document


def _page_row(row: dict[str, Any], position: int, total: int, payload: bytes, render_ms: float) -> dict[str, Any]:
    return {"key": row["key"], "source": row["source"], "options": row["options"], "pdf": row["pdf"],
            "position": position, "total": total, "payload": payload, "render_ms": render_ms, "error": None}


def _failure(row: dict[str, Any], error: str) -> dict[str, Any]:
    return {**_page_row(row, 0, 0, b"", 0.0), "error": error}


class RenderedPages:
    """The engine actor's PDF renderer: pages arrive rendered (by the render tasks, with the renderer and
    plan the service would have used), each as a one-page PDF for the service to read; ``render`` hands
    back the page a read's placeholder bytes name. So the service's PDF path runs unchanged after it."""

    def __init__(self) -> None:
        self._held: dict[bytes, Any] = {}

    def hold(self, rendered: Rendered) -> bytes:
        from ..pipeline.pdf import RenderedDocument

        token = PLACEHOLDER + uuid.uuid4().hex.encode()
        self._held[token] = RenderedDocument(rendered.page_count, (rendered.page,))
        return token

    async def render(self, data: bytes, plan: Any, *, param: str | None = None) -> Any:
        return self._held.pop(data)

    def release(self, token: bytes) -> None:
        """A read that ended before its page was taken (refused, say)."""
        self._held.pop(token, None)

    def close(self) -> None:
        self._held.clear()
