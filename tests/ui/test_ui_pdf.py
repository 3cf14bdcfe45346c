"""A PDF in the web UI, in a real browser (Debian's Chromium via Playwright) against a real hyocr
server on the rapidocr engine: uploaded, previewed, read page by page, each page on its own tab."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pdfs
from browser import choose_task, shot, status, upload
from imaging import card, squash

PAGES = [["FIRST PAGE ALPHA 101", "INVOICE TOTAL 99.50"], ["SECOND PAGE BRAVO 202"]]


def _text(page) -> str:
    return squash(page.locator("#hy-text textarea").input_value())


def test_a_two_page_pdf_is_read_page_by_page(page, tmp_path):
    upload(page, tmp_path, {"letter.pdf": pdfs.text_pdf(PAGES)})
    page.get_by_text("2-page PDF ready").wait_for()
    assert page.locator("#hy-pdf-pages").is_visible()  # a page selection, for PDFs only
    choose_task(page, "Plain text")
    page.locator("#hy-run").click()
    page.get_by_text("Done:").wait_for()
    assert "on 2 pages" in status(page)
    assert "FIRSTPAGEALPHA101" in _text(page) and "BRAVO" not in _text(page)
    shot(page, "pdf-page-1")
    page.locator("#hy-pages").get_by_text("Page 2").click()
    page.wait_for_function("() => document.querySelector('#hy-text textarea').value.includes('BRAVO')")
    assert "SECONDPAGEBRAVO202" in _text(page) and "ALPHA" not in _text(page)
    shot(page, "pdf-page-2")

    with page.expect_download() as download:
        page.locator("#hy-download").click()
    body = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert [(p["index"], p["dpi"], p["source"]) for p in body["pages"]] == [(0, 150, "render"), (1, 150, "render")]


def test_a_page_selection_reads_only_those_pages(page, tmp_path):
    upload(page, tmp_path, {"letter.pdf": pdfs.text_pdf(PAGES)})
    page.get_by_text("2-page PDF ready").wait_for()
    page.locator("#hy-pdf-pages textarea, #hy-pdf-pages input").first.fill("2")
    choose_task(page, "Plain text")
    page.locator("#hy-run").click()
    page.get_by_text("Done:").wait_for()
    assert "SECONDPAGEBRAVO202" in _text(page) and "ALPHA" not in _text(page)
    assert "pages" not in status(page)  # one page read


def test_a_hostile_pdf_is_reported_on_upload(page, tmp_path):
    upload(page, tmp_path, {"locked.pdf": pdfs.encrypted_pdf()})
    error = page.locator("#hy-status .hy-error")
    error.wait_for()
    assert "locked.pdf: the PDF is encrypted" in error.inner_text()
    shot(page, "pdf-encrypted")


def test_a_multi_page_tiff_is_announced_as_a_tiff(page, tmp_path):
    # A scanner's TIFF of several pages is read as a document (its pages selectable) and was announced as a PDF
    frames = [card().image.convert("RGB") for _ in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    upload(page, tmp_path, {"scan.tif": out.getvalue()})
    page.get_by_text("3-page TIFF ready").wait_for()
    assert page.locator("#hy-pdf-pages").is_visible() and "PDF" not in status(page)
