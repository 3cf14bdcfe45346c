"""A TIFF of several pages (a fax, a scanner's document) read as a document, over real HTTP with the real
rapidocr engine: every page, or the pages selected, through /v1/ocr and /v1/jobs (ranges of one page), and
through hyocr ocr; as one image (chat) it is refused, never cut to its first page."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
import time

import requests
from imaging import squash
from PIL import Image, ImageDraw, ImageFont

TEXTS = ["FIRST PAGE ALPHA 101", "SECOND PAGE BRAVO 202", "THIRD PAGE CHARLIE 303"]


def _fax() -> bytes:
    """Three bilevel pages, Group 4 compressed at fax resolution, as a fax server writes them."""
    font = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 40)
    pages = []
    for text in TEXTS:
        page = Image.new("1", (1200, 400), 1)
        ImageDraw.Draw(page).text((60, 160), text, font=font, fill=0)
        pages.append(page)
    out = io.BytesIO()
    pages[0].save(out, "TIFF", save_all=True, append_images=pages[1:], compression="group4", dpi=(204, 196))
    return out.getvalue()


def _read(body: dict) -> list[tuple[int, str | None, str]]:
    return [(p["index"], p.get("source"), squash(p["text"])) for p in body["pages"]]


def test_every_page_or_the_selected_ones_through_v1_ocr(rapid_server):
    fax = _fax()
    whole = requests.post(f"{rapid_server.url}/v1/ocr", files={"file": ("fax.tif", fax, "image/tiff")},
                          data={"task": "text"}, timeout=120)
    assert whole.status_code == 200, whole.text
    assert _read(whole.json()) == [(i, "image", squash(t)) for i, t in enumerate(TEXTS)]
    assert [(p["width"], p["height"]) for p in whole.json()["pages"]] == [(1200, 400)] * 3
    picked = requests.post(f"{rapid_server.url}/v1/ocr", json={"image": base64.b64encode(fax).decode(),
                                                                "task": "text", "pages": "3"}, timeout=120)
    assert _read(picked.json()) == [(2, "image", squash(TEXTS[2]))], picked.text
    past = requests.post(f"{rapid_server.url}/v1/ocr", json={"image": base64.b64encode(fax).decode(),
                                                              "pages": "4"}, timeout=60)
    assert past.status_code == 400 and "the document has 3 pages" in past.json()["error"]["message"]


def test_as_one_image_it_is_refused(rapid_server):
    url = "data:image/tiff;base64," + base64.b64encode(_fax()).decode()
    chat = requests.post(f"{rapid_server.url}/v1/chat/completions", timeout=60, json={"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "OCR"}]}]})
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "multi_page_tiff", chat.text
    beside = requests.post(f"{rapid_server.url}/v1/ocr", timeout=60,
                           files=[("file", ("fax.tif", _fax(), "image/tiff")), ("file", ("b.tif", _fax(), "image/tiff"))])
    assert beside.status_code == 400 and beside.json()["error"]["code"] == "multi_page_tiff", beside.text


def test_a_job_reads_it_in_ranges_as_a_pdf(fake_server_factory):
    server = fake_server_factory(engine="rapidocr", ui=False, job_range_pages=1)
    job = requests.post(f"{server.url}/v1/jobs", files={"file": ("fax.tif", _fax(), "image/tiff")},
                        data={"task": "text", "pages": "2-3"}, timeout=60).json()
    assert job["pages"]["total"] == 2, job
    deadline = time.monotonic() + 120
    while (state := requests.get(f"{server.url}/v1/jobs/{job['id']}", timeout=10).json())["status"] in (
            "queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert state["status"] == "succeeded", state
    result = requests.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=10).json()
    assert _read(result) == [(1, "image", squash(TEXTS[1])), (2, "image", squash(TEXTS[2]))]


def test_hyocr_ocr_names_its_pages(tmp_path):
    path = tmp_path / "fax.tif"
    path.write_bytes(_fax())
    done = subprocess.run([sys.executable, "-m", "hyocr", "ocr", str(path), "--task", "text", "--pages", "2-3"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert squash(done.stdout) == squash(f"[page 2]\n{TEXTS[1]}\n[page 3]\n{TEXTS[2]}")
