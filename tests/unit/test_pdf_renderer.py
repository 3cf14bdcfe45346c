"""The PDF render workers, for real: PDFium in its own processes, killed and replaced when a document
hangs it, crashes it or outgrows its memory, while the pool keeps rendering the next documents."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pdfs
import pytest

from hyocr.errors import InvalidMedia, PayloadTooLarge, ServiceUnavailable, UnprocessableDocument
from hyocr.pipeline.pdf import PdfRenderer, RenderPlan

DETECTOR = RenderPlan(fixed_dpi=150, max_pixels=40_000_000)
SMALL = pdfs.one_page(b"[0 0 200 200]")


@pytest.fixture
async def renderer():
    pool = PdfRenderer(workers=2, timeout=5.0, memory_mb=512)
    yield pool
    pool.close()


async def _still_renders(pool: PdfRenderer) -> None:
    document = await pool.render(SMALL, DETECTOR)
    assert document.pages[0].image.size == (417, 417)


async def test_pages_come_back_in_page_order_at_their_dpi(renderer):
    data = pdfs.text_pdf([["FIRST"], ["SECOND"], ["THIRD"], ["FOURTH"]])
    document = await renderer.render(data, RenderPlan(pages="4,2-3", fixed_dpi=150, max_pixels=40_000_000))
    assert document.page_count == 4
    assert [p.index for p in document.pages] == [1, 2, 3]
    for page in document.pages:
        assert (page.width, page.height, page.dpi, page.source) == (1240, 1755, 150, "render")
        pixels = np.asarray(page.image)
        assert pixels.shape == (1755, 1240, 3) and (pixels < 100).any() and pixels.mean() > 240  # text on white


async def test_text_layer_pages_skip_rendering_and_scans_are_rendered(renderer):
    line = "A TYPESET PAGE WITH ITS OWN TEXT LAYER 2024"
    data = pdfs.mixed_pdf([line], ["A SCANNED PAGE"])
    document = await renderer.render(data, RenderPlan(fixed_dpi=150, max_pixels=40_000_000, text_layer=True))
    typeset, scanned = document.pages
    assert (typeset.source, typeset.image, typeset.text) == ("text_layer", None, line)
    assert (typeset.dpi, typeset.width, typeset.height) == (72, 595, 842) and not typeset.needs_engine
    assert scanned.source == "render" and scanned.text is None and scanned.needs_engine


async def test_document_errors_leave_the_worker_in_service(renderer):
    with pytest.raises(InvalidMedia) as exc:
        await renderer.render(pdfs.encrypted_pdf(), DETECTOR)
    assert exc.value.code == "pdf_encrypted"
    with pytest.raises(InvalidMedia, match="damaged or not a PDF"):
        await renderer.render(SMALL[: len(SMALL) // 2], DETECTOR)
    with pytest.raises(PayloadTooLarge, match="page 1: the page is 200 x 200 inches"):
        await renderer.render(pdfs.one_page(b"[0 0 14400 14400]"), DETECTOR)
    assert renderer.kills == 0
    await _still_renders(renderer)


@pytest.mark.parametrize("damaged", [pdfs.cyclic_pdf("count-over-cycle"), pdfs.build_pdf(
    [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>"])], ids=["cyclic", "no-pages"])
async def test_a_damaged_pdf_after_an_encrypted_one_is_not_called_encrypted(damaged):
    # PDFium fails these loads without setting its (process-wide) last error: the worker that just
    # refused an encrypted document must not report them as encrypted too.
    pool = PdfRenderer(workers=1, timeout=5.0, memory_mb=512)
    try:
        with pytest.raises(InvalidMedia) as first:
            await pool.render(pdfs.encrypted_pdf(), DETECTOR)
        assert first.value.code == "pdf_encrypted"
        with pytest.raises(InvalidMedia) as second:
            await pool.render(damaged, DETECTOR)
        assert second.value.code == "invalid_pdf" and "damaged" in second.value.message
        assert pool.kills == 0
    finally:
        pool.close()


async def test_an_encrypted_pdf_with_an_empty_user_password_opens():
    pool = PdfRenderer(workers=1)
    try:
        document = await pool.render(pdfs.encrypted_pdf(user_password=b""), DETECTOR)
        assert document.pages[0].image is not None
    finally:
        pool.close()


async def test_a_page_that_renders_too_long_kills_the_worker_and_the_next_document_is_served():
    pool = PdfRenderer(workers=1, timeout=1.0)
    try:
        started = time.monotonic()
        with pytest.raises(UnprocessableDocument) as exc:
            await pool.render(pdfs.slow_pdf(), DETECTOR)
        assert time.monotonic() - started < 5
        assert exc.value.status == 422 and exc.value.code == "pdf_render_timeout"
        assert "rendering page 1 took longer than 1 s" in exc.value.message
        assert pool.kills == 1
        await _still_renders(pool)  # a fresh worker
    finally:
        pool.close()


async def test_a_worker_that_dies_mid_render_is_a_422_and_is_replaced(renderer):
    render = asyncio.ensure_future(renderer.render(pdfs.slow_pdf(), DETECTOR))
    for _ in range(100):  # the worker that took the job
        await asyncio.sleep(0.05)
        busy = list(renderer._live - set(renderer._idle))
        if busy:
            break
    await asyncio.sleep(0.3)
    os.kill(busy[0].process.pid, signal.SIGKILL)  # as a segfault in PDFium would end it
    with pytest.raises(UnprocessableDocument) as exc:
        await render
    assert exc.value.code == "pdf_render_failed" and "damaged or needs too much memory" in exc.value.message
    await _still_renders(renderer)


async def test_closing_the_pool_mid_render_is_a_quiet_503_not_a_logged_failure(caplog):
    # hyocr batch's Ctrl-C (and a server's shutdown) closes the pool while a thread reads from a worker:
    # the read fails on a closed descriptor, which is the shutdown, not a fault to log with a traceback.
    pool = PdfRenderer(workers=1, timeout=10.0)
    render = asyncio.ensure_future(pool.render(pdfs.slow_pdf(), DETECTOR))
    for _ in range(100):
        await asyncio.sleep(0.05)
        if pool._live:
            break
    await asyncio.sleep(0.3)
    pool.close()
    with pytest.raises(ServiceUnavailable) as exc:
        await render
    assert exc.value.status == 503 and exc.value.code == "shutting_down"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_a_render_past_the_memory_limit_fails_alone():
    pool = PdfRenderer(workers=1, memory_mb=128)
    try:
        a0 = pdfs.one_page(b"[0 0 2384 3370]")  # at 212 dpi: 40 MP, 120 MB of pixels
        with pytest.raises(UnprocessableDocument, match="more memory than a render may use"):
            await pool.render(a0, RenderPlan(fixed_dpi=300, max_pixels=40_000_000))
        await _still_renders(pool)
    finally:
        pool.close()


async def test_an_abandoned_render_kills_its_worker_at_once(renderer):
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(renderer.render(pdfs.slow_pdf(), DETECTOR), 0.5)
    for _ in range(40):
        if renderer.kills:
            break
        await asyncio.sleep(0.05)
    assert renderer.kills == 1 and time.monotonic() - started < 3
    await _still_renders(renderer)


async def test_documents_share_the_pool_and_never_exceed_its_workers(renderer):
    data = pdfs.text_pdf([["ONE"], ["TWO"]])
    documents = await asyncio.gather(*(renderer.render(data, DETECTOR) for _ in range(6)))
    assert all([p.index for p in d.pages] == [0, 1] for d in documents)
    assert len(renderer._idle) <= 2 and len(renderer._live) <= 2

