"""A real `hyocr serve` process under the burst of issue 15 (item 3): small requests that declare huge images.

Three concurrent requests, each eight white 6300x6300 PNGs (40 M pixels each, 131 kB as PNG). Before the
fix the server decoded and kept all 24 at full size: +3.6 GiB of RSS on the fake engine, all of it still held
afterwards. Now each image is decoded within the decode budget and reduced at once to what the engine keeps
(HunyuanOCR's 2048x2048), so the peak is bounded by

    kept pages (3 x 8 x 2048 x 2048 x 4 bytes = 384 MiB) + the decode budget (256 MiB) + 128 MiB slack

(measured: +591 MiB), and the memory goes back to the system once the pages are gone.
"""

from __future__ import annotations

import base64
import concurrent.futures
import signal
import subprocess
import threading
import time

import pytest
import requests
from imaging import to_bytes
from PIL import Image
from servers import serve_process

REQUESTS, IMAGES, SIDE = 3, 8, 6300
BUDGET_MB = 256
KEPT_MB = REQUESTS * IMAGES * 2048 * 2048 * 4 // 2**20
BOUND_MB = KEPT_MB + BUDGET_MB + 128
RELEASED_MB = 100


def _rss(pid: int, key: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for {pid}")


@pytest.fixture
def server():
    env = {"HYOCR_ENGINE": "fake", "HYOCR_DECODE_BUDGET_MB": str(BUDGET_MB),
           "HYOCR_MAX_REQUEST_PIXELS": str(REQUESTS * IMAGES * SIDE * SIDE), "HYOCR_LOG_LEVEL": "warning"}
    proc, url = serve_process("--no-ui", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield proc, url
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(240)
def test_a_burst_of_huge_images_stays_within_the_memory_bound_and_is_released(server):
    proc, url = server
    png = to_bytes(Image.new("RGB", (SIDE, SIDE), "white"), optimize=True)
    body = {"images": [base64.b64encode(png).decode()] * IMAGES, "task": "spotting"}
    tiny = base64.b64encode(to_bytes(Image.new("RGB", (64, 32), "white"))).decode()
    assert requests.post(f"{url}/v1/ocr", json={"image": tiny, "task": "text"}, timeout=30).ok  # warm
    time.sleep(0.5)
    baseline = _rss(proc.pid)

    peak, over, done = [baseline], threading.Event(), threading.Event()

    def watch() -> None:  # 50 samples a second; stops the server at once when it goes over the bound
        while not done.is_set():
            peak[0] = max(peak[0], _rss(proc.pid))
            if peak[0] - baseline > BOUND_MB * 2**20:
                over.set()
                proc.kill()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(REQUESTS) as pool:
        futures = [pool.submit(requests.post, f"{url}/v1/ocr", json=body, timeout=200)
                   for _ in range(REQUESTS)]
        results = []
        for future in futures:
            try:
                results.append(future.result())
            except requests.RequestException as exc:
                results.append(exc)
    elapsed = time.monotonic() - started
    done.set()
    watcher.join()
    grown = (max(peak[0], _rss(proc.pid, "VmHWM")) - baseline) / 2**20 if not over.is_set() else None
    assert not over.is_set(), (f"the server's RSS went over baseline + {BOUND_MB} MiB under the burst "
                               f"(baseline {baseline / 2**20:.0f} MiB)")
    assert grown is not None and grown <= BOUND_MB, f"peak RSS baseline + {grown:.0f} MiB > {BOUND_MB} MiB"
    for r in results:
        assert isinstance(r, requests.Response) and r.status_code == 200, r
        pages = r.json()["pages"]
        assert [(p["width"], p["height"]) for p in pages] == [(SIDE, SIDE)] * IMAGES
        # The fake engine answers HunyuanOCR's 0-1000 grid: boxes come back in the upload's pixels.
        assert pages[0]["blocks"][0]["box"] == [630.0, 630.0, 3150.0, 1260.0]

    # Released: the fake engine keeps its last 64 engine requests (their pages) for assertions; push them out.
    for _ in range(64):
        assert requests.post(f"{url}/v1/ocr", json={"image": tiny, "task": "text"}, timeout=30).ok
    deadline = time.monotonic() + 10
    while (after := (_rss(proc.pid) - baseline) / 2**20) > RELEASED_MB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert after <= RELEASED_MB, f"baseline + {after:.0f} MiB still held after the burst (peak +{grown:.0f})"
    print(f"burst of {REQUESTS}x{IMAGES} {SIDE}x{SIDE} PNGs: {elapsed:.1f} s, peak +{grown:.0f} MiB "
          f"(bound {BOUND_MB}), after +{after:.0f} MiB")
