"""PDFs on /v1/ocr over real HTTP, read by the real rapidocr engine: rendered text pages come back
page by page, in order, as selected; hostile documents get a 4xx in bounded time and the server
keeps serving."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Iterator

import pdfs
import pytest
import requests
from conftest import serve
from imaging import card, squash

from hyocr.client import HyocrClient

PAGES = [
    ["INVOICE 2024-117", "TOTAL DUE 1280.00"],
    ["DELIVERY NOTE 55", "QUANTITY 12 BOXES"],
    ["RECEIPT 9031", "PAID BY CARD"],
    ["APPENDIX ALPHA", "SIGNED IN BERLIN"],
]
DOC = pdfs.text_pdf(PAGES)


def _post_pdf(server, data: bytes, **form) -> requests.Response:
    return requests.post(f"{server.url}/v1/ocr", files={"file": ("doc.pdf", data, "application/pdf")},
                         data=form, timeout=120)


def _assert_pages_read(pages: list[dict], numbers: list[int]) -> None:
    """Each page holds its own lines and no other page's (1-based page numbers)."""
    assert [p["index"] for p in pages] == [n - 1 for n in numbers]
    for page, number in zip(pages, numbers, strict=True):
        text = squash(page["text"])
        for line in PAGES[number - 1]:
            assert squash(line) in text, f"page {number}: {line!r} not in {page['text']!r}"
        for other, lines in enumerate(PAGES, 1):
            if other != number:
                assert not any(squash(line) in text for line in lines), f"page {number} has page {other}'s text"


def test_a_multi_page_pdf_is_read_page_by_page_in_order(rapid_server):
    r = _post_pdf(rapid_server, DOC, task="text")
    assert r.status_code == 200, r.text
    body = r.json()
    _assert_pages_read(body["pages"], [1, 2, 3, 4])
    for page in body["pages"]:  # A4 at rapidocr's 150 dpi
        assert (page["width"], page["height"], page["dpi"], page["source"]) == (1240, 1755, 150, "render")
        assert page["finish_reason"] == "stop"
    assert body["text"] == "\n\n".join(p["text"] for p in body["pages"])


def test_a_page_range_is_honoured_over_base64_json(rapid_server):
    payload = {"image": base64.b64encode(DOC).decode(), "task": "spotting", "pages": "4, 2-3"}
    r = requests.post(f"{rapid_server.url}/v1/ocr", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    pages = r.json()["pages"]
    _assert_pages_read(pages, [2, 3, 4])
    for page in pages:  # boxes in pixels of the page as rendered
        assert page["blocks"] and all(0 <= b["box"][0] < b["box"][2] <= 1240 and b["box"][3] <= 1755
                                      for b in page["blocks"])


def test_a_scanned_pdf_without_a_text_layer_is_read(rapid_server):
    scanned = pdfs.scanned_pdf([["SCANNED LETTER 77", "KIND REGARDS"], ["SECOND SHEET 88"]])
    r = _post_pdf(rapid_server, scanned, task="text", prefer_text_layer="true")
    assert r.status_code == 200, r.text
    one, two = r.json()["pages"]
    assert one["source"] == two["source"] == "render"  # no text layer to prefer
    assert "SCANNEDLETTER77" in squash(one["text"]) and "KINDREGARDS" in squash(one["text"])
    assert "SECONDSHEET88" in squash(two["text"])


def test_prefer_text_layer_takes_reliable_text_and_ocrs_the_rest(rapid_server):
    line = "TYPESET CONTRACT 4410 BETWEEN THE PARTIES"
    data = pdfs.mixed_pdf([line], ["SCANNED ANNEX 12"])
    r = _post_pdf(rapid_server, data, task="text", prefer_text_layer="true")
    assert r.status_code == 200, r.text
    typeset, scanned = r.json()["pages"]
    assert (typeset["source"], typeset["text"], typeset["dpi"]) == ("text_layer", line, 72)
    assert scanned["source"] == "render" and "SCANNEDANNEX12" in squash(scanned["text"])
    # Other tasks always render: the text layer has no boxes.
    r = _post_pdf(rapid_server, data, task="spotting", prefer_text_layer="true")
    assert [p["source"] for p in r.json()["pages"]] == ["render", "render"]


def test_stream_sends_each_page_as_it_finishes_then_the_result(rapid_server):
    r = requests.post(f"{rapid_server.url}/v1/ocr", files={"file": ("doc.pdf", DOC, "application/pdf")},
                      data={"task": "text", "pages": "1-3", "stream": "true"}, stream=True, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    *pages, result = [json.loads(e) for e in events[:-1]]
    assert [p["object"] for p in pages] == ["ocr.page"] * 3 and result["object"] == "ocr.result"
    assert [p["completed"] for p in pages] == [1, 2, 3] and {p["total"] for p in pages} == {3}
    assert sorted(p["page"]["index"] for p in pages) == [0, 1, 2]
    _assert_pages_read(result["pages"], [1, 2, 3])
    assert {p["page"]["index"]: p["page"]["text"] for p in pages} == {p["index"]: p["text"] for p in result["pages"]}


def test_the_python_client_reads_a_pdf_with_progress(rapid_server):
    seen = []
    with HyocrClient(rapid_server.url, timeout=120) as client:
        result = client.ocr(DOC, task="text", pages="2-3", on_page=lambda page, done, total: seen.append(
            (page.index, done, total)))
    assert sorted(i for i, _, _ in seen) == [1, 2] and [d for _, d, _ in seen] == [1, 2] and seen[0][2] == 2
    assert [p.index for p in result.pages] == [1, 2] and result.pages[0].dpi == 150
    assert result.pages[0].source == "render" and "DELIVERYNOTE55" in squash(result.pages[0].text)


def test_a_client_that_hangs_up_mid_stream_frees_its_slot_without_an_error(rapid_server, caplog):
    """The pages still running are cancelled quietly: no 'unexpected error' (a RuntimeError from closing
    a generator that was still running, on Python 3.11) and the admission slot comes back."""
    import logging
    import socket

    data = pdfs.scanned_pdf([[f"PAGE {n} OF EIGHT"] for n in range(8)])
    boundary = "hyocrtest"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"task\"\r\n\r\ntext\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.pdf\"\r\n"
            "Content-Type: application/pdf\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    admission = rapid_server.app.state.service.admission
    with caplog.at_level(logging.ERROR):
        with socket.create_connection(("127.0.0.1", rapid_server.port)) as sock:
            sock.sendall(b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary="
                         + boundary.encode() + f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            received = b""
            sock.settimeout(60)
            while b'"object": "ocr.page"' not in received and b'"object":"ocr.page"' not in received:
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            assert b"200 OK" in received  # the first page has arrived; hang up with the rest running
        deadline = time.monotonic() + 30
        while admission.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    assert admission.in_flight == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    _still_serving(rapid_server)


# --------------------------------------------------------------------------- hostile documents

HOSTILE = {
    "encrypted": (pdfs.encrypted_pdf(), {}, 400, "pdf_encrypted"),
    "truncated": (DOC[: len(DOC) // 2], {}, 400, "invalid_pdf"),
    "not-really-a-pdf": (b"%PDF-1.7\n" + b"\x00garbage" * 100, {}, 400, "invalid_pdf"),
    **{f"cyclic-{kind}": (pdfs.cyclic_pdf(kind), {}, 400, "invalid_pdf") for kind in pdfs.CYCLIC},
    "5000-pages": (pdfs.many_pages_pdf(5000), {}, 400, "too_many_pages"),
    "page-out-of-range": (DOC, {"pages": "3-9"}, 400, "invalid_pages"),
    # neither an image nor a PDF, with pages: was "pages selects pages of a PDF; this request has images"
    "html-with-pages": (b"<!DOCTYPE html><html><body>a saved web page</body></html>", {"pages": "1"}, 400, "invalid_image"),
    "mediabox-14400": (pdfs.one_page(b"[0 0 14400 14400]"), {}, 413, "pdf_page_too_large"),
    "mediabox-1e9": (pdfs.one_page(b"[0 0 1000000000 1000000000]"), {}, 413, "pdf_page_too_large"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_pdfs_get_a_4xx_fast_and_the_server_keeps_serving(rapid_server, name):
    data, form, status, code = HOSTILE[name]
    started = time.monotonic()
    r = _post_pdf(rapid_server, data, task="text", **form)
    assert time.monotonic() - started < 20
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and "Traceback" not in error["message"]
    assert name != "html-with-pages" or "not a recognised image or PDF" in error["message"], error
    assert not re.search(r"\b0x[0-9a-f]{6,}", error["message"])  # no memory addresses
    _still_serving(rapid_server)


def test_thousands_of_pages_with_a_range_are_read(rapid_server):
    r = _post_pdf(rapid_server, pdfs.many_pages_pdf(5000), pages="4999-5000", task="text")
    assert r.status_code == 200, r.text
    assert [p["index"] for p in r.json()["pages"]] == [4998, 4999]


def test_a_broken_page_is_an_error_page_and_the_others_are_read(rapid_server):
    r = _post_pdf(rapid_server, pdfs.partly_cyclic_pdf(), task="text")
    assert r.status_code == 200, r.text
    good, bad = r.json()["pages"]
    assert good["finish_reason"] == "stop" and good["source"] == "render"
    assert bad["finish_reason"] == "error" and bad["error"] == "page 2: PDFium could not load this page"


def test_chat_routes_take_images_not_pdfs(rapid_server):
    url = "data:application/pdf;base64," + base64.b64encode(DOC).decode()
    r = requests.post(f"{rapid_server.url}/v1/chat/completions", timeout=60, json={
        "model": "x", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == 415 and "/v1/ocr" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def strict_server() -> Iterator:
    """rapidocr with a 1 s render timeout and a 200 kB PDF cap."""
    server = serve(engine="rapidocr", pdf_render_timeout=1.0, max_pdf_bytes=200_000, pdf_workers=2)
    yield server
    server.stop()


def test_a_pdf_that_renders_too_long_is_a_422_and_the_server_keeps_serving(strict_server):
    started = time.monotonic()
    r = _post_pdf(strict_server, pdfs.slow_pdf(), task="text")
    assert time.monotonic() - started < 10
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "pdf_render_timeout"
    assert "took longer than 1 s" in r.json()["error"]["message"]
    _still_serving(strict_server)


def test_while_pdfs_hang_the_workers_images_and_health_are_answered(strict_server):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        slow = [pool.submit(_post_pdf, strict_server, pdfs.slow_pdf(), task="text") for _ in range(2)]
        time.sleep(0.3)
        started = time.monotonic()
        assert requests.get(f"{strict_server.url}/health", timeout=5).status_code == 200
        image = requests.post(f"{strict_server.url}/v1/ocr", files={"file": ("c.png", card().png(), "image/png")},
                              data={"task": "text"}, timeout=60)
        assert image.status_code == 200 and "JOHNSMITH" in squash(image.json()["text"])
        assert time.monotonic() - started < 10
        assert [f.result().status_code for f in slow] == [422, 422]


def test_a_pdf_over_the_byte_cap_is_413(strict_server):
    big = pdfs.scanned_pdf([["BIG"]] * 4, dpi=200)
    assert len(big) > 200_000
    r = _post_pdf(strict_server, big, task="text")
    assert r.status_code == 413 and "the PDF is larger than the 200000 byte limit" in r.json()["error"]["message"]


def test_a_document_renders_no_more_pixels_than_its_budget():
    """A few-kB PDF of 64 giant blank pages rendered 11 GB of pixels into the server. Now the document
    has one pixel budget (MAX_DOCUMENT_PIXELS): pages past it are error pages."""
    server = serve(engine="rapidocr", max_document_pixels=2_000_000)
    try:
        kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(3))
        page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 400 400] >>"  # 834x834 at 150 dpi: 0.7 MP
        data = pdfs.build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                               b"<< /Type /Pages /Kids [%s] /Count 3 >>" % kids, page, page, page])
        r = _post_pdf(server, data, task="text")
        assert r.status_code == 200, r.text
        pages = r.json()["pages"]
        assert [(p["index"], p["finish_reason"], p["width"]) for p in pages[:2]] == [(0, "stop", 834), (1, "stop", 834)]
        assert pages[2]["finish_reason"] == "error" and "2000000-pixel budget" in pages[2]["error"]
        assert "pages=3-" in pages[2]["error"]
        alone = _post_pdf(server, data, task="text", pages="3")  # the way the message says
        assert alone.status_code == 200 and alone.json()["pages"][0]["finish_reason"] == "stop"
    finally:
        server.stop()


def _still_serving(server) -> None:
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
    r = _post_pdf(server, pdfs.text_pdf([["STILL SERVING 42"]]), task="text")
    assert r.status_code == 200 and "STILLSERVING42" in squash(r.json()["text"]), r.text
