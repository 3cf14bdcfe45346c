"""The stall watchdog over real HTTP: progress is judged per engine request, never over a cold start or
an idle spell, a long one-shot request is not a stall, a request hung among flowing ones fails alone,
and a stuck engine is restarted with retryable errors for what it held."""

from __future__ import annotations

import base64
import concurrent.futures
import time

import requests
from imaging import Line, card, render

from hyocr.engines.fake import FakeEngine, FakeScript

IMAGE = base64.b64encode(card().png()).decode()


def _ocr(url: str, question: str = "", *, timeout: float = 60, **extra) -> requests.Response:
    body = {"image": IMAGE, "task": "vqa", "question": question or "what is written?", **extra}
    return requests.post(f"{url}/v1/ocr", json=body, timeout=timeout)


def _restarts(url: str) -> int:
    return requests.get(f"{url}/ready", timeout=5).json()["restarts"]


def test_the_first_request_after_a_start_longer_than_the_stall_timeout_is_served(fake_server_factory):
    engine = FakeEngine(FakeScript(start_delay=2.5, latency=1.5))  # a cold start past the stall timeout
    server = fake_server_factory(engine, ui=False, stall_timeout=1.0)
    r = _ocr(server.url)
    assert r.status_code == 200, r.text
    assert engine.starts == 1 and _restarts(server.url) == 0


def test_the_first_request_after_idling_longer_than_the_stall_timeout_is_served(fake_server_factory):
    engine = FakeEngine(FakeScript(latency=1.5))
    server = fake_server_factory(engine, ui=False, stall_timeout=1.0)
    assert _ocr(server.url).status_code == 200
    time.sleep(2.5)  # idle for longer than the stall timeout
    r = _ocr(server.url)
    assert r.status_code == 200, r.text
    assert engine.starts == 1 and _restarts(server.url) == 0


def test_pdf_rendering_and_decoding_before_the_engine_are_not_stalls(fake_server_factory):
    from pdfs import slow_pdf

    engine = FakeEngine(FakeScript(latency=0.2))
    # 50k strokes: seconds to render here, far past the 1 s stall timeout; the render timeout leaves a loaded CI
    # machine room (200k took 27 s of a 30 s timeout there)
    server = fake_server_factory(engine, ui=False, stall_timeout=1.0, pdf_render_timeout=120)
    started = time.monotonic()
    r = requests.post(f"{server.url}/v1/ocr", files={"file": ("slow.pdf", slow_pdf(50_000), "application/pdf")},
                      data={"task": "text"}, timeout=180)
    assert r.status_code == 200, r.text
    assert time.monotonic() - started > 1.0, "the render was expected to take longer than the stall timeout"
    assert engine.starts == 1 and _restarts(server.url) == 0


def test_a_request_hung_among_flowing_ones_fails_alone_with_a_retryable_503(fake_server_factory):
    engine = FakeEngine(FakeScript(token_delay=0.2))
    server = fake_server_factory(engine, ui=False, stall_timeout=1.0, request_timeout=60)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        hung = pool.submit(_ocr, server.url, "[[fake:hang]]")
        time.sleep(0.3)  # it reached the engine first; the others overtake it
        silent = pool.submit(_ocr, server.url, "[[fake:hang_mid]]")  # one word, then silence
        started = time.monotonic()
        # 30 tokens 0.2 s apart: these stream for 6 s, past both stall timeouts and two watchdog ticks
        flowing = [pool.submit(_ocr, server.url, max_tokens=30, ignore_eos=True, loop_guard=False)
                   for _ in range(2)]
        results = [hung.result(), silent.result()]
        waited = time.monotonic() - started
        flows = [f.result() for f in flowing]
    for r in results:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "engine_stalled" and int(r.headers["Retry-After"]) > 0
    assert waited < 5, "a hung request waited for its deadline instead of the stall timeout"
    assert all(r.status_code == 200 for r in flows), [r.text for r in flows]
    assert engine.starts == 1 and _restarts(server.url) == 0  # the engine itself was fine
    assert not engine.active  # the hung requests' engine work was aborted


def test_an_engine_making_no_progress_at_all_is_restarted_and_its_requests_get_a_retryable_503(
        fake_server_factory):
    engine = FakeEngine()
    server = fake_server_factory(engine, ui=False, stall_timeout=1.0, request_timeout=60)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stuck = [pool.submit(_ocr, server.url, "[[fake:hang]]") for _ in range(2)]
        results = [f.result() for f in stuck]
    assert time.monotonic() - started < 6  # the stall timeout and a tick, not the 60 s deadline
    for r in results:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "engine_restarting" and int(r.headers["Retry-After"]) > 0
    assert engine.starts == 2 and _restarts(server.url) == 1
    assert _ocr(server.url).status_code == 200


def _dense_page():
    lines = [Line(f"LINE {n:02d} INVOICE 2026-12-{n % 28 + 1:02d} AMOUNT {n * 13.5:9.2f} EUR PAID", (40, 30 + 44 * n), 26)
             for n in range(24)]
    return render(lines, size=(1400, 1120))


def test_long_rapidocr_requests_are_not_stalls(fake_server_factory):
    # One rapidocr worker and a stall timeout far below a dense page's reading time: the watchdog must
    # judge these one-shot requests by their expected duration, and the queued ones not at all.
    server = fake_server_factory(engine="rapidocr", ui=False, workers=1, stall_timeout=0.5, request_timeout=120)
    page = base64.b64encode(_dense_page().png()).decode()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(requests.post, f"{server.url}/v1/ocr", json={"image": page, "task": "text"},
                               timeout=120) for _ in range(2)]
        results = [f.result() for f in futures]
    elapsed = time.monotonic() - started
    assert elapsed > 1.0, f"the pages were expected to take longer than the stall timeout ({elapsed:.1f}s)"
    for r in results:
        assert r.status_code == 200, r.text
        assert "INVOICE" in r.json()["text"]
    assert _restarts(server.url) == 0
