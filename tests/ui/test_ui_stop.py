"""`hyocr serve` stopped while a browser tab has the web UI open, idle after a read: the stop must not wait
DRAIN_TIMEOUT for the tab (Gradio holds a stream per open session and ends it only on its own server's stop
signal, which a mounted UI never got: 31 s against a 30 s drain, and a warning of a request still running)."""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace

from browser import chromium, open_ui, upload
from imaging import card
from servers import serve_process


def test_an_idle_open_tab_does_not_hold_the_servers_stop(tmp_path):
    proc, url = serve_process("--engine", "rapidocr", "--drain-timeout", "30",
                              env={"HYOCR_LOG_FORMAT": "json", "HYOCR_DATA_DIR": str(tmp_path / "data")})
    try:
        with chromium() as browser, open_ui(browser, SimpleNamespace(url=url)) as page:
            upload(page, tmp_path, {"card.png": card().png()})
            page.locator("#hy-status", has_text="ready").wait_for()
            page.locator("#hy-run").click()
            page.locator("#hy-status", has_text="Done").wait_for()
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 0
            took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stdout.read()
    assert "drain timeout" not in log and "Traceback" not in log, log[-2000:]
    assert took < 20, took  # the drain is 30 s; an idle tab's stream ends when the stop begins
