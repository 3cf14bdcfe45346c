"""``hyocr serve`` stopped with requests still running past DRAIN_TIMEOUT: real processes, real sockets.

What the README promises holds for them too: a JSON error in the OpenAI shape (503 ``shutting_down`` with
``Retry-After`` and ``X-Request-ID``), a stream under way ended with an error event and ``[DONE]``, and no
traceback in the log; the process still exits 0.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import signal
import subprocess
import sys
import time

import requests
from imaging import card
from servers import serve_process

HYOCR = [sys.executable, "-m", "hyocr"]
IMAGE = "data:image/png;base64," + base64.b64encode(card().png()).decode()


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    return serve_process("--engine", "fake", "--no-ui", *args, env={"HYOCR_LOG_FORMAT": "json"})


def _chat(url: str, text: str, **extra) -> requests.Response:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                                      {"type": "text", "text": text}]}], **extra}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=60, stream=bool(extra.get("stream")),
                         headers={"X-Request-ID": f"drain-{'stream' if extra.get('stream') else 'plain'}"})


def _stream_events(url: str) -> list:
    """A chat stream that is under way when the drain ends: its events, as the client saw them."""
    r = _chat(url, "read", stream=True, max_tokens=16384, ignore_eos=True, loop_guard=False)  # minutes of tokens
    assert r.status_code == 200
    events = []
    for line in r.iter_lines(decode_unicode=True):
        if line:
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_requests_running_past_the_drain_timeout_get_a_json_503_and_streams_end_cleanly():
    # token_delay: the stream of 16384 tokens goes on for minutes; delay=60: the plain request waits that long
    proc, url = _start("--drain-timeout", "1.5", "--model", "token_delay=0.02")
    try:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            plain = pool.submit(_chat, url, "[[fake:delay=60]] question")
            ocr = pool.submit(requests.post, f"{url}/v1/ocr", timeout=60,
                              json={"image": IMAGE, "task": "vqa", "question": "[[fake:hang]]"})
            stream = pool.submit(_stream_events, url)
            time.sleep(1.0)  # all three are in the engine, the stream is sending
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            r, r_ocr, events = plain.result(), ocr.result(), stream.result()
        answered = time.monotonic() - stopped
        for resp in (r, r_ocr):
            assert resp.status_code == 503, resp.text
            assert resp.headers["content-type"] == "application/json"
            assert resp.headers["retry-after"].isdigit()
            assert resp.json()["error"]["code"] == "shutting_down"
            assert resp.json()["error"]["type"] == "service_unavailable"
            assert len(resp.headers["x-request-id"]) >= 8
        assert r.headers["x-request-id"] == "drain-plain"
        assert 1.0 < answered < 6  # at the drain timeout, not uvicorn's cancellation later
        # The stream was under way: it ends with an error event and [DONE], not a reset connection.
        assert events[-1] == "[DONE]" and "error" in events[-2], (len(events), events[-3:])
        assert events[-2]["error"]["code"] == "shutting_down"
        assert len(events) > 3  # text had been streamed before the end
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stdout.read()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert "Internal Server Error" not in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    access = {line["request_id"]: line for line in lines if line.get("logger") == "hyocr.access"}
    assert access["drain-plain"]["status"] == 503 and access["drain-plain"]["rejected"] == "shutting_down"
    assert not [line for line in lines if line["level"] == "error"], [line for line in lines if line["level"] == "error"]


def test_a_request_that_finishes_within_the_drain_is_answered_as_usual():
    proc, url = _start("--drain-timeout", "5")
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            plain = pool.submit(_chat, url, "[[fake:delay=1.5]] question")
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            r = plain.result()
        assert r.status_code == 200, r.text
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_process_exits_soon_after_the_drain_though_engine_threads_still_work():
    """A CPU engine's thread cannot be interrupted: the interpreter waited for it, 16 s past a 3 s drain.
    Now it gets 2 s, then the process exits 0, saying so."""
    proc, url = _start("--drain-timeout", "1")
    try:
        busy = concurrent.futures.ThreadPoolExecutor(1).submit(_chat, url, "[[fake:busy=30]] question")
        time.sleep(1.0)  # on the engine's thread
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert busy.result().status_code == 503
        assert proc.wait(timeout=30) == 0
        assert time.monotonic() - stopped < 8  # 1 s drain + 2 s for the thread + start-up of the exit
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stdout.read()
    assert "thread(s) still at abandoned work" in log and "Traceback" not in log, log[-2000:]


def test_an_idle_resolver_does_not_hold_the_exit():
    """A webhook address is resolved on the server's DNS pool; its idle threads had held every later exit for
    the whole grace, logged as engine threads at abandoned work."""
    proc, url = _start("--drain-timeout", "1")
    try:
        r = requests.post(f"{url}/v1/jobs", json={"image": IMAGE, "task": "text",
                                                  "callback_url": "https://hooks.invalid/ocr"}, timeout=60)
        assert r.status_code == 400, r.text  # the name does not resolve: refused at submit, after a lookup
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = proc.stdout.read()
    assert "abandoned work" not in log and "Traceback" not in log, log[-2000:]

