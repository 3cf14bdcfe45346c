"""Image memory over real HTTP (issue 15, items 3 and 6): the per-request pixel cap, early resizing with the
real rapidocr engine (boxes in the uploaded image's pixels), and the fetch stage in the metrics.

tests/e2e/test_memory_burst.py measures a real `hyocr serve` process's memory under a burst.
"""

from __future__ import annotations

import base64
import http.server
import threading
import time

import requests
from imaging import Line, render, squash, to_bytes
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

WHITE_6300 = base64.b64encode(to_bytes(Image.new("RGB", (6300, 6300), "white"), optimize=True)).decode()


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - ix * iy
    return ix * iy / union if union > 0 else 0.0


def _stage_counts(server) -> dict[str, float]:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    return {s.labels["stage"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "hyocr_stage_duration_seconds_count"}


def test_the_issues_request_is_refused_from_its_headers_by_default(fake_server_factory):
    """Eight white 6300x6300 PNGs (317 M pixels, a few hundred kB) are over the 160 M default per request:
    413 at once, before anything is decoded, whatever else is in flight."""
    server = fake_server_factory(max_request_pixels=160_000_000)
    started = time.monotonic()
    results = []

    def post() -> None:
        body = {"images": [WHITE_6300] * 8, "task": "text"}
        results.append(requests.post(f"{server.url}/v1/ocr", json=body, timeout=30))

    threads = [threading.Thread(target=post) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - started < 10
    for r in results:
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["code"] == "too_many_pixels" and error["type"] == "invalid_request_error"
        assert "317520000 pixels" in error["message"] and "160000000" in error["message"]
        assert error["param"] == "images.4"  # the image that crossed the cap
    assert server.app.state.service.inputs.memory.budget.peak == 0
    four = requests.post(f"{server.url}/v1/ocr", json={"images": [WHITE_6300] * 4, "task": "text"},
                         timeout=120)
    assert four.status_code == 200, four.text  # 159 M: within the cap
    assert [(p["width"], p["height"]) for p in four.json()["pages"]] == [(6300, 6300)] * 4


def test_rapidocr_reads_a_large_image_reduced_with_boxes_in_its_own_pixels(rapid_server):
    """4000x2400 is reduced to 2000x1200 (what RapidOCR reads anyway) before it reaches the engine; the boxes
    come back in pixels of the 4000x2400 upload."""
    lines = [Line("INVOICE NUMBER 2026-0042", (200, 300), 120),
             Line("TOTAL DUE 1234.50 EUR", (200, 1200), 120),
             Line("PAID IN FULL", (2400, 2000), 120)]
    rendered = render(lines, size=(4000, 2400))
    r = requests.post(f"{rapid_server.url}/v1/ocr", files={"file": ("big.png", rendered.png(), "image/png")},
                      data={"task": "spotting"}, timeout=120)
    assert r.status_code == 200, r.text
    page = r.json()["pages"][0]
    assert (page["width"], page["height"]) == (4000, 2400)
    assert squash("TOTAL DUE 1234.50 EUR") in squash(r.json()["text"])
    for line, drawn in zip(lines, rendered.boxes, strict=True):
        best = max((_iou(b["box"], drawn) for b in page["blocks"]), default=0.0)
        assert best > 0.5, f"no box on {line.text!r} at {drawn}: {page['blocks']}"
    for block in page["blocks"]:
        assert all(0 <= x <= 4000 and 0 <= y <= 2400 for x, y in block["polygon"])


class _ImageHost(http.server.BaseHTTPRequestHandler):
    body = to_bytes(render([Line("FETCHED", (20, 20), 40)], size=(320, 100)).image)

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args) -> None:
        pass


def test_the_fetch_stage_is_recorded_in_the_metrics(fake_server_factory):
    host = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHost)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    try:
        server = fake_server_factory(allowed_media_domains="127.0.0.1", media_fetch_allow_private=True)
        before = _stage_counts(server)
        url = f"http://127.0.0.1:{host.server_address[1]}/card.png"
        r = requests.post(f"{server.url}/v1/ocr", json={"image": url, "task": "text"}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["pages"][0]["width"] == 320
        b64 = base64.b64encode(_ImageHost.body).decode()
        assert requests.post(f"{server.url}/v1/ocr", json={"image": b64, "task": "text"}, timeout=30).ok
        after = _stage_counts(server)
    finally:
        host.shutdown()
        host.server_close()
    assert after.get("fetch", 0) - before.get("fetch", 0) == 1  # the URL request only
    assert after["decode"] - before.get("decode", 0) == 2


def test_budget_wait_is_bounded_and_answered_503(fake_server_factory):
    """An image waits for its share of the budget; held elsewhere past the queue timeout, the request is a
    503 decode_busy with Retry-After (and the budget is intact afterwards)."""
    server = fake_server_factory(queue_timeout=0.5)
    budget = server.app.state.service.inputs.memory.budget
    held = budget.capacity
    budget.used += held  # another request's decode, as far as the budget can tell
    try:
        image = base64.b64encode(to_bytes(Image.new("RGB", (1024, 640), "white"))).decode()
        r = requests.post(f"{server.url}/v1/ocr", json={"image": image, "task": "text"}, timeout=30)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "decode_busy" and r.headers["Retry-After"] == "1"
    finally:
        budget.used -= held
    assert requests.post(f"{server.url}/v1/ocr", json={"image": image, "task": "text"}, timeout=30).ok
