"""A 15 MB scan through every way in, over real HTTP with the real rapidocr engine and the default caps
(MAX_IMAGE_BYTES 20 MiB, MAX_BODY_BYTES 64 MiB): JSON base64 and data URLs are sized from the media caps,
not the 1 M-character text cap, and the client uploads files as multipart. Past the caps: 413 from the
string's length; a huge text field is still a 400; callback headers that HTTP cannot carry are refused at
submit."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
import requests
from conftest import serve
from imaging import Line, card, render, squash, to_bytes

from hyocr.client import AsyncHyocrClient, HyocrClient

LINES = [Line("QUARTERLY REPORT 2024", (120, 150), 96), Line("INVOICE No. 7731-B", (120, 600), 96),
         Line("TOTAL DUE 4,512.80 EUR", (120, 1050), 96), Line("SIGNED J. DOE", (120, 1500), 96)]
MiB = 1024 * 1024
ACTIVE = ("queued", "running")


@pytest.fixture(scope="module")
def scan() -> bytes:
    """A rendered page as an uncompressed PNG: 2600x1950 (5 M pixels, under MAX_IMAGE_PIXELS), 15.2 MB."""
    data = to_bytes(render(LINES, size=(2600, 1950)).image, "PNG", compress_level=0)
    assert 14.5e6 < len(data) < 20 * MiB
    return data


@pytest.fixture(scope="module")
def server():
    server = serve(engine="rapidocr", ui=False)  # the default body and media caps
    yield server
    server.stop()


def _assert_read(body: dict) -> None:
    text = squash(body["text"])
    for line in LINES:
        assert squash(line.text) in text, f"{line.text!r} not in {body['text']!r}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _job_ids(url: str) -> list[str]:
    return [j["id"] for j in requests.get(f"{url}/v1/jobs?limit=100", timeout=10).json()["data"]]


def _job_result(url: str, job: dict, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while (job := requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json())["status"] in ACTIVE:
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["status"] == "succeeded", job
    return requests.get(f"{url}/v1/jobs/{job['id']}/result", timeout=30).json()


def test_ocr_reads_a_15_mb_scan_as_json_base64_as_a_data_url_and_as_an_upload(server, scan):
    url = f"{server.url}/v1/ocr"
    for body in ({"image": _b64(scan), "task": "text"},
                 {"image": "data:image/png;base64," + _b64(scan), "task": "text"}):
        r = requests.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text[:500]
        _assert_read(r.json())
    r = requests.post(url, files={"file": ("scan.png", scan, "image/png")}, data={"task": "text"},
                      timeout=120)
    assert r.status_code == 200, r.text[:500]
    _assert_read(r.json())


def test_jobs_read_a_15_mb_scan_sent_as_json_and_as_an_upload(server, scan):
    url = server.url
    as_json = requests.post(f"{url}/v1/jobs", json={"image": _b64(scan), "task": "text"}, timeout=120)
    upload = requests.post(f"{url}/v1/jobs", files={"file": ("scan.png", scan, "image/png")},
                           data={"task": "text"}, timeout=120)
    assert as_json.status_code == upload.status_code == 202, (as_json.text[:500], upload.text[:500])
    _assert_read(_job_result(url, as_json.json()))
    _assert_read(_job_result(url, upload.json()))


def test_the_clients_upload_a_15_mb_scan(server, scan, tmp_path):
    path = tmp_path / "scan.png"
    path.write_bytes(scan)
    with HyocrClient(server.url, timeout=120) as client:
        job = client.submit_job(path, task="text")
        assert client.wait(job.id, poll=0.2, timeout=120).status == "succeeded"
        _assert_read(client.job_result(job.id).raw)

    async def several() -> dict:
        async with AsyncHyocrClient(server.url, timeout=120) as client:
            return (await client.ocr_many([scan], task="text")).raw
    _assert_read(asyncio.run(several()))


def test_an_image_over_the_cap_in_json_is_413_on_every_route(server):
    over = _b64(b"\x89PNG\r\n\x1a\n" + bytes(21 * MiB))  # 21 MiB: over MAX_IMAGE_BYTES, within the body cap
    url = server.url
    before = _job_ids(url)
    cases = [
        ("/v1/ocr", {"image": over}, "image"),
        ("/v1/ocr", {"images": [over]}, "images.0"),
        ("/v1/jobs", {"image": "data:image/png;base64," + over}, "image"),
        ("/v1/completions", {"prompt": "", "image": over}, "image"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + over}}]}]},
         "messages.0.content.0.image_url"),
    ]
    for path, body, param in cases:
        r = requests.post(url + path, json=body, timeout=120)
        assert r.status_code == 413, (path, r.text[:300])
        error = r.json()["error"]
        assert error["param"] == param and str(20 * MiB) in error["message"], (path, error)
    assert _job_ids(url) == before  # nothing stored


def test_a_huge_text_field_is_still_a_400(server):
    image = _b64(card().png())
    for path, body, param in [("/v1/ocr", {"image": image, "task": "vqa", "question": "x" * 1_000_001},
                               "question"),
                              ("/v1/completions", {"prompt": "x" * 1_000_001, "image": image}, "prompt")]:
        r = requests.post(server.url + path, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), (path, r.text[:300])
        assert "1000000 characters" in r.json()["error"]["message"]


def test_callback_headers_http_cannot_carry_are_refused_at_submit(server):
    image = card().png()
    hook = "https://hooks.example.com/ocr"
    before = _job_ids(server.url)
    for name, value, says in [("X-Note", "café", "ASCII"), ("X-Note", "a\x01b", "control characters"),
                              # set by hyocr on every delivery: accepted and then dropped was a silent surprise
                              ("Host", "evil.example", "set by hyocr"), ("webhook-signature", "v1,x", "set by hyocr"),
                              ("Content-Length", "5", "set by hyocr")]:
        headers = {name: value}
        as_json = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(image), "callback_url": hook,
                                                               "callback_headers": headers}, timeout=60)
        upload = requests.post(f"{server.url}/v1/jobs", files={"file": ("card.png", image, "image/png")},
                               data={"callback_url": hook, "callback_headers": json.dumps(headers)},
                               timeout=60)
        for r in (as_json, upload):
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "callback_headers" and name in error["message"], error
            assert says in error["message"], error
    bad_json = requests.post(f"{server.url}/v1/jobs", files={"file": ("card.png", image, "image/png")},
                             data={"callback_url": hook, "callback_headers": "{X-Note: 1"}, timeout=60)
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] == "callback_headers"
    empty = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(image), "callback_url": ""}, timeout=60)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "callback_url", empty.text
    assert _job_ids(server.url) == before  # nothing stored


class _Receiver(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).seen.append(dict(self.headers))
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_an_uploaded_jobs_callback_headers_are_delivered(fake_server_factory):
    """The client's multipart submit carries callback_headers (JSON text in the form) to the webhook."""
    _Receiver.seen = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        server = fake_server_factory(ui=False, media_fetch_allow_private=True)
        hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        image = to_bytes(render([Line("HOOK", (20, 20), 30)], size=(200, 80)).image)
        with HyocrClient(server.url, timeout=30) as client:
            client.submit_job(image, task="text", callback_url=hook, callback_headers={"X-Mine": " yes "})
        deadline = time.monotonic() + 60
        while not _Receiver.seen and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        receiver.shutdown()
    assert _Receiver.seen and _Receiver.seen[0]["X-Mine"] == "yes"  # the spaces around it are not the value


def test_an_unrecognised_file_names_pdf_only_where_pdfs_are_read(server):
    text = b"a text file named .pdf"
    for r in (requests.post(f"{server.url}/v1/ocr", files={"file": ("notes.pdf", text, "application/pdf")},
                            timeout=30),
              requests.post(f"{server.url}/v1/jobs", json={"image": _b64(text)}, timeout=30)):
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert message == "file is not a recognised image or PDF (PNG, JPEG, WebP, BMP, TIFF, PDF)"
    part = {"type": "image_url", "image_url": {"url": "data:application/pdf;base64," + _b64(text)}}
    chat = requests.post(f"{server.url}/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": [part]}]}, timeout=30)
    assert chat.status_code == 400 and "PDF" not in chat.json()["error"]["message"], chat.text
