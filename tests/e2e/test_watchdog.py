"""The stall watchdog on a real `hyocr serve`, as the issue reproduced it: a start longer than the stall
timeout, a first request, an idle spell longer than it, another request. Neither may restart the engine."""

from __future__ import annotations

import base64
import signal
import time

import requests
from imaging import card
from servers import serve_process

IMAGE = base64.b64encode(card().png()).decode()


def test_a_cold_start_and_an_idle_spell_longer_than_the_stall_timeout_restart_nothing():
    proc, url = serve_process("--engine", "fake", "--no-ui", "--model", "start_delay=3,latency=1.0",
                              env={"HYOCR_STALL_TIMEOUT": "2"})
    try:
        body = {"image": IMAGE, "task": "text"}
        first = requests.post(f"{url}/v1/ocr", json=body, timeout=30)  # at once after ready
        time.sleep(3)  # idle past the stall timeout
        second = requests.post(f"{url}/v1/ocr", json=body, timeout=30)
        assert (first.status_code, second.status_code) == (200, 200), (first.text, second.text)
        assert requests.get(f"{url}/ready", timeout=5).json()["restarts"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert "restarting" not in proc.stdout.read()
