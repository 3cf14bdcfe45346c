"""The CLI as a user runs it: real processes, real files, the real rapidocr engine."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from imaging import card, chinese_card, squash
from servers import free_port, wait_ready

HYOCR = [sys.executable, "-m", "hyocr"]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, **(env or {})})


def test_ocr_command_prints_recognised_text(tmp_path):
    path = tmp_path / "card.png"
    card().image.save(path)
    zh = tmp_path / "zh.jpg"
    chinese_card().image.save(zh, quality=95)
    done = _run("ocr", str(path), str(zh), "--task", "text")
    assert done.returncode == 0, done.stderr
    out = squash(done.stdout)
    assert "JOHNSMITH" in out and "张三" in out and f"=={str(path).upper()}==" in out


def test_ocr_command_json_output(tmp_path):
    path = tmp_path / "card.png"
    rendered = card()
    rendered.image.save(path)
    done = _run("ocr", str(path), "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body["task"] == "spotting" and body["file"] == str(path)
    assert len(body["pages"][0]["blocks"]) >= len(rendered.lines)


def test_ocr_command_errors_are_one_line_and_exit_nonzero(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("not an image")
    done = _run("ocr", str(bad), str(tmp_path / "missing.png"))
    assert done.returncode == 1
    assert "not a recognised image" in done.stderr and "No such file" in done.stderr
    assert "Traceback" not in done.stderr
    named = tmp_path / "scan.pdf"  # not a PDF inside: the message names PDF among what is read
    named.write_text("not a pdf")
    done = _run("ocr", str(named))
    assert done.returncode == 1 and "not a recognised image or PDF" in done.stderr and "PDF)" in done.stderr
    unsupported = _run("ocr", str(bad), "--task", "document")
    assert unsupported.returncode == 1 and "vision-language engine" in unsupported.stderr


def test_bad_settings_are_reported_clearly():
    done = _run("serve", "--port", "99999")
    assert done.returncode == 2
    assert "port (HYOCR_PORT / --port)" in done.stderr and "Traceback" not in done.stderr
    env_bad = _run("serve", env={"HYOCR_MAX_IMAGE_BYTES": "lots"})
    assert env_bad.returncode == 2 and "HYOCR_MAX_IMAGE_BYTES" in env_bad.stderr
    unknown = _run("serve", "--engine", "nope")
    assert unknown.returncode == 2 and "unknown engine 'nope'" in unknown.stderr


def test_serve_process_answers_then_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*HYOCR, "serve", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "HYOCR_API_KEYS": "k-e2e"})
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        r = requests.post(f"http://127.0.0.1:{port}/v1/ocr", files={"file": ("c.png", card().png())},
                          headers={"Authorization": "Bearer k-e2e"}, timeout=60)
        assert r.status_code == 200 and "JOHNSMITH" in squash(r.json()["text"])
        # the same through the CLI's client mode
        path = tmp_path / "card.png"
        card().image.save(path)
        url = f"http://127.0.0.1:{port}"
        remote = _run("ocr", str(path), "--url", url, "--api-key", "k-e2e", "--timeout", "60", "--json")
        assert remote.returncode == 0, remote.stderr
        assert "JOHNSMITH" in squash(json.loads(remote.stdout)["text"])
        denied = _run("ocr", str(path), "--url", url)
        assert denied.returncode == 1 and "401" in denied.stderr and "Traceback" not in denied.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    log = proc.stdout.read()
    assert code == 0, log
    assert "engine rapidocr ready" in log


def test_sigterm_under_load_finishes_in_flight_requests_then_exits_0():
    import concurrent.futures

    port = free_port()
    proc = subprocess.Popen([*HYOCR, "serve", "--port", str(port), "--engine", "fake", "--model", "latency=1.5",
                             "--no-ui"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url)
        body = {"image": "data:image/png;base64," + base64.b64encode(card().png()).decode(),
                "task": "text"}
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futures = [pool.submit(requests.post, f"{url}/v1/ocr", json=body, timeout=30) for _ in range(6)]
            time.sleep(0.5)  # all six are in the engine now
            proc.send_signal(signal.SIGTERM)
            codes = [f.result().status_code for f in futures]
        assert codes == [200] * 6  # nothing in flight was lost
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_sets_the_gil_switch_interval_before_serving(monkeypatch):
    import signal as signals

    import uvicorn

    from hyocr import cli
    from hyocr.config import load_settings

    seen = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: seen.update(
        interval=sys.getswitchinterval(), started=setattr(self, "started", True)))
    before = sys.getswitchinterval()
    handlers = {s: signals.getsignal(s) for s in (signals.SIGTERM, signals.SIGINT)}
    try:
        assert cli.serve(load_settings(engine="fake", ui=False, gil_switch_interval=0.001)) == 0
    finally:
        sys.setswitchinterval(before)
        for s, handler in handlers.items():
            signals.signal(s, handler)
    assert seen["interval"] == pytest.approx(0.001)


def test_ocr_command_honours_the_request_deadline_like_the_server(tmp_path):
    # In-process, the CLI reads through the service's one stream: admitted, and timed from admission.
    path = tmp_path / "card.png"
    card().image.save(path)
    started = time.monotonic()
    done = _run("ocr", str(path), "--engine", "fake", "--model", "latency=30", "--request-timeout", "1",
                "--task", "text")
    assert done.returncode == 1 and "took longer than 1s" in done.stderr, done.stderr
    assert time.monotonic() - started < 25  # not the engine's 30 s
