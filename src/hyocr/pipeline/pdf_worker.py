"""The PDF render worker: a process of its own that owns PDFium, one document at a time, and the
rules it reads pages by (which pages, at what DPI, whether a text layer can be trusted).

Its pipe carries, per document: in, a ``RenderPlan`` then the PDF's bytes; out, ``("open", count,
selected)``, then per selected page ``("page", index, dpi, width, height)`` followed by the raw RGB
bytes, or ``("text", index, width, height, text)``, or ``("page_error", index, width, height, kind,
message, param, code)``, and finally ``("done",)``. A document the worker cannot open is one
``("error", kind, message, param, code)``. A hang or a crash is the parent's to handle (it kills
the process); an address-space limit set before PDFium loads turns a memory bomb into a failed
allocation here instead of an out-of-memory host.
"""

from __future__ import annotations

import math
import re
import resource
import signal
import unicodedata
from multiprocessing.connection import Connection

from ..errors import HyocrError, InvalidMedia, InvalidRequest, PayloadTooLarge
from ..hunyuan.geometry import PixelBounds, visual_tokens
from .pdf import POINTS_PER_INCH, RenderPlan, error_parts

TEXT_LAYER_MIN_CHARS = 16  # fewer visible characters: nothing to trust (a scan, a stray page number)
TEXT_LAYER_MIN_GOOD = 0.95  # share of characters that must be letters, digits, punctuation or symbols
_RANGE = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d*)\s*)?$", re.ASCII)  # "１" is not a page number


# ------------------------------------------------------------------ the rules (pure)


def parse_pages(spec: str | None, count: int, max_pages: int) -> tuple[int, ...]:
    """``"2-5,8"`` (1-based, ranges inclusive, ``"7-"`` to the end) -> 0-based page indices in page
    order, each once. None or "" or "all": every page. Raises 400s that name the page count."""
    if spec is None or spec.strip().lower() in ("", "all"):
        ranges = [(1, count)]
    else:
        ranges = []
        for part in spec.split(","):
            match = _RANGE.match(part)
            if match is None:
                raise InvalidRequest(f"pages: {part.strip()!r} is not a page number or range; "
                                     "expected e.g. 2-5,8", param="pages", code="invalid_pages")
            first = int(match.group(1))
            last = first if not match.group(2) else int(match.group(3)) if match.group(3) else max(count, first)
            if first < 1 or last < first:
                why = "the first page is 1" if first < 1 else "a range runs from its first page to its last"
                raise InvalidRequest(f"pages: {part.strip()!r} is not a range of pages ({why})",
                                     param="pages", code="invalid_pages")
            if last > count:
                raise InvalidRequest(f"pages: page {last} is out of range; the document has {count} "
                                     f"page{'s' if count != 1 else ''}", param="pages", code="invalid_pages")
            ranges.append((first, last))
    merged: list[list[int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    total = sum(last - first + 1 for first, last in merged)
    if total > max_pages:  # counted before any list of pages is built
        what = f"the document has {count} pages" if spec is None else f"pages selects {total} pages"
        start = merged[0][0]
        raise InvalidRequest(f"{what}; at most {max_pages} are read per request: choose some with pages, e.g. "
                             f"pages={start}-{min(count, start + max_pages - 1)}, or read it whole as a job "
                             "(/v1/jobs, hyocr batch)", param="pages", code="too_many_pages")
    return tuple(i - 1 for first, last in merged for i in range(first, last + 1))


def pixels_at(width_pt: float, height_pt: float, dpi: float) -> tuple[int, int]:
    """The bitmap size PDFium renders a page of this size to at ``dpi`` (it rounds up)."""
    scale = dpi / POINTS_PER_INCH
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def choose_dpi(width_pt: float, height_pt: float, plan: RenderPlan) -> int:
    """The highest whole DPI (at most the plan's) whose render fits ``max_pixels`` and, for HunyuanOCR,
    whose visual tokens (the 32-pixel grid of its resize) fit the budget. 413 when even ``min_dpi``
    does not fit: a page that large holds nothing readable at a resolution the model can take."""
    if not (width_pt > 0 and height_pt > 0):
        raise InvalidMedia("the page has no area", param="pages", code="invalid_pdf")
    top = plan.fixed_dpi or plan.max_dpi
    # Highest DPI within the pixel cap, from the area; the loop then corrects for ceil() rounding.
    fits = POINTS_PER_INCH * math.sqrt(plan.max_pixels / (width_pt * height_pt))
    bounds = PixelBounds(*plan.bounds) if plan.bounds and plan.token_budget else None
    for dpi in range(min(top, math.floor(fits)), plan.min_dpi - 1, -1):
        width, height = pixels_at(width_pt, height_pt, dpi)
        if width * height > plan.max_pixels:
            continue
        # (visual_tokens answers 400 for a page past the model's 200:1 aspect limit)
        if bounds is not None and visual_tokens(height, width, bounds) > plan.token_budget:
            continue
        return dpi
    width, height = pixels_at(width_pt, height_pt, plan.min_dpi)
    raise PayloadTooLarge(
        f"the page is {width_pt / POINTS_PER_INCH:.0f} x {height_pt / POINTS_PER_INCH:.0f} inches: "
        f"{width}x{height} pixels even at {plan.min_dpi} dpi, over the {plan.max_pixels}-pixel limit",
        param="pages", code="pdf_page_too_large")


def text_layer_reliable(text: str) -> bool:
    """Whether a page's embedded text can stand in for OCR: enough of it, and nearly all of it real
    characters. Broken font mappings show up as control, private-use or replacement characters."""
    visible = [c for c in text if not c.isspace()]
    if len(visible) < TEXT_LAYER_MIN_CHARS:
        return False
    good = sum(unicodedata.category(c)[0] in "LNPS" and c != "\ufffd" for c in visible)
    return good >= TEXT_LAYER_MIN_GOOD * len(visible)


def clean_text_layer(text: str) -> str:
    """PDFium's text -> plain text: newlines, no trailing spaces, no empty runs."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


# ------------------------------------------------------------------ the process


def main(fd: int, memory_mb: int) -> None:
    """Serve documents on the socket ``fd`` (from the parent) until it closes."""
    # A terminal's Ctrl-C reaches the whole process group: the parent decides what stops (hyocr batch writes
    # its summary), and a worker caught mid-render must not print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import pypdfium2  # noqa: F401 (loaded once, under the limit)

    conn = Connection(fd)

    conn.send(("ready",))
    while True:
        try:
            plan = conn.recv()
            data = conn.recv_bytes()
        except (EOFError, OSError, KeyboardInterrupt):  # the server went away
            return
        try:
            render(conn, data, plan)
        except HyocrError as exc:
            conn.send(("error", *error_parts(exc)))
        except Exception as exc:  # noqa: BLE001 (MemoryError past the limit, a PDFium surprise: start afresh)
            why = "needs more memory than a render may use" if isinstance(exc, MemoryError) else "could not be rendered"
            conn.send(("fatal", "unprocessable", f"the PDF {why}", None, "pdf_render_failed"))
            return


def render(conn, data: bytes, plan: RenderPlan) -> None:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        pdf = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        # PDFium's last error is process-wide and some failed loads leave it as it was: after an
        # encrypted document, a damaged one would read "password" too. Only a PDF with an /Encrypt
        # entry (in its trailer, never compressed) can be encrypted.
        if exc.err_code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY) and b"/Encrypt" in data:
            raise InvalidMedia("the PDF is encrypted: send it without a password", code="pdf_encrypted") from None
        raise InvalidMedia("the PDF is damaged or not a PDF: PDFium could not open it", code="invalid_pdf") from None
    try:
        selected = parse_pages(plan.pages, len(pdf), plan.max_pages)
        pdf.init_forms()  # filled-in form fields are part of what a page shows
        conn.send(("open", len(pdf), selected))
        left = plan.max_total_pixels
        for index in selected:
            rendered = _page(conn, pdf, index, plan, left)
            left = None if left is None else left - rendered
        conn.send(("done",))
    finally:
        pdf.close()


def _page(conn, pdf, index: int, plan: RenderPlan, left: int | None = None) -> int:
    """Send one page (rendered, its text, or an error); the pixels rendered. ``left``: the pixels the
    document may still render (None: no limit)."""
    import pypdfium2 as pdfium

    size = (0, 0)
    try:
        page = pdf[index]
    except pdfium.PdfiumError:
        _page_error(conn, index, size, InvalidMedia("PDFium could not load this page", code="invalid_pdf"))
        return 0
    try:
        width_pt, height_pt = page.get_size()
        size = (math.ceil(width_pt), math.ceil(height_pt))  # at 72 dpi, a pixel per point
        if plan.text_layer:
            textpage = page.get_textpage()
            text = textpage.get_text_bounded()
            textpage.close()
            if text_layer_reliable(text):
                conn.send(("text", index, *size, clean_text_layer(text)))
                return 0
        dpi = choose_dpi(width_pt, height_pt, plan)
        width, height = pixels_at(width_pt, height_pt, dpi)
        if left is not None and width * height > left:
            raise PayloadTooLarge(
                f"not read: the pages before it use the {plan.max_total_pixels}-pixel budget of one request; "
                f"read it in another (pages={index + 1}-)", param="pages", code="pdf_too_large")
        bitmap = page.render(scale=dpi / POINTS_PER_INCH, rev_byteorder=True)  # packed RGB
        conn.send(("page", index, dpi, bitmap.width, bitmap.height))
        conn.send_bytes(bitmap.buffer)
        rendered = bitmap.width * bitmap.height
        bitmap.close()
        return rendered
    except HyocrError as exc:
        _page_error(conn, index, size, exc)
    except pdfium.PdfiumError:
        _page_error(conn, index, size, InvalidMedia("PDFium could not render this page", code="invalid_pdf"))
    finally:
        page.close()
    return 0


def _page_error(conn, index: int, size: tuple[int, int], exc: HyocrError) -> None:
    kind, message, param, code = error_parts(exc)
    conn.send(("page_error", index, *size, kind, f"page {index + 1}: {message}", param, code))

