"""``hyocr serve`` and ``hyocr ocr`` as a user runs them (issue 15, items 4 and 6): the HTTP parser's 400 in
JSON on the default parser, the loud warning of a server exposed without auth, pages named from 1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import requests
from pdfs import text_pdf
from servers import raw_exchange, serve_process

HYOCR = [sys.executable, "-m", "hyocr"]
MALFORMED = {
    "nul in a header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
    "cr in a header": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Bad: a\rb\r\n\r\n",
    "bad content-length": b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    "content-length not a number": b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello, TLS\r\n\r\n",
}


def _serve(*args: str) -> tuple[subprocess.Popen, str]:
    return serve_process("--engine", "fake", "--no-ui", *args, env={"HYOCR_LOG_FORMAT": "json"})


def _stop(proc: subprocess.Popen) -> list[dict]:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return [json.loads(line) for line in proc.stdout.read().splitlines() if line.startswith("{")]


def _json_error(reply: bytes, status: bytes, name: str) -> dict:
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), (name, reply[:300])
    headers = {k.strip().lower(): v.strip() for k, _, v in
               (line.partition(b":") for line in head.split(b"\r\n")[1:])}
    assert headers[b"content-type"] == b"application/json", name
    assert len(headers[b"x-request-id"]) == 32 and headers[b"connection"] == b"close", name
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error", name
    return error


def test_malformed_http_gets_the_apis_json_400():
    proc, url = _serve()
    port = int(url.rsplit(":", 1)[1])
    try:
        for name, data in MALFORMED.items():
            assert _json_error(raw_exchange(port, data), b"400", name)["code"] == "bad_http_request", name
        # too long rather than malformed: the request line past the header bound is a 414, in the same shape
        oversized = b"GET /health?" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        assert _json_error(raw_exchange(port, oversized), b"414", "long line")["code"] == "uri_too_long"
        assert requests.get(f"{url}/health", timeout=5).status_code == 200  # the server is unharmed
    finally:
        lines = _stop(proc)
    assert not [line for line in lines if line["level"] == "error"]
    # bound to loopback: no exposure warning
    assert not [line for line in lines if "beyond loopback" in line["message"]]


def test_a_server_exposed_without_auth_warns_at_start_and_in_v1_models():
    proc, url = _serve("--host", "0.0.0.0")
    try:
        info = requests.get(f"{url}/v1/models", timeout=10).json()["hyocr"]
    finally:
        lines = _stop(proc)
    assert info["exposed"] is True and info["auth"] is False and "beyond loopback" in info["warning"]
    warnings = [line for line in lines if line["level"] == "warning" and "beyond loopback" in line["message"]]
    assert len(warnings) == 1 and "HYOCR_API_KEYS" in warnings[0]["message"]
    started = next(i for i, line in enumerate(lines) if "Uvicorn running" in line["message"])
    assert lines.index(warnings[0]) < started  # said before it serves


def test_hyocr_ocr_names_pages_from_1_as_pages_does(tmp_path):
    path = tmp_path / "five.pdf"
    path.write_bytes(text_pdf([[f"PAGE {i}"] for i in range(1, 6)], page_size=(300, 200)))
    done = subprocess.run([*HYOCR, "ocr", str(path), "--engine", "fake", "--task", "vqa", "--question",
                           "[[fake:fail]] q", "--pages", "2-3"], check=False, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["[page 2]", "[page 2: the engine failed on this page]",
                     "[page 3]", "[page 3: the engine failed on this page]"], lines
    as_json = subprocess.run([*HYOCR, "ocr", str(path), "--engine", "fake", "--task", "text", "--pages", "2-3",
                              "--json"], check=False, capture_output=True, text=True, timeout=180)
    assert [p["index"] for p in json.loads(as_json.stdout)["pages"]] == [1, 2]  # the API's 0-based index


def test_a_port_in_use_fails_before_the_engine_loads_and_a_loading_server_refuses_connections(tmp_path):
    """The port is taken before the engine loads: a second server on it exits at once (it used to load its
    engine and start its job runner first), and the first refuses connections until it is up."""
    import os
    import socket
    import time

    from servers import free_port, wait_ready

    port = free_port()
    command = [*HYOCR, "serve", "--engine", "fake", "--model", "start_delay=8", "--no-ui", "--port", str(port)]
    first = subprocess.Popen(command, env={**os.environ, "HYOCR_DATA_DIR": str(tmp_path / "first")},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # a plain bind fails once the first server holds the port
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    break
            assert time.monotonic() < deadline and first.poll() is None, "the first server did not take its port"
            time.sleep(0.05)
        with socket.socket() as client:  # loading: refused now, not queued behind an engine still loading
            assert client.connect_ex(("127.0.0.1", port)) != 0
        second = subprocess.run(command, env={**os.environ, "HYOCR_DATA_DIR": str(tmp_path / "second")},
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in second.stderr, second.stderr
        # Nothing started: no application start-up, no engine, no job runner (whose first act is its secret)
        output = second.stdout + second.stderr
        assert "application startup" not in output and "engine fake" not in output, output
        assert not (tmp_path / "second" / "webhook-secret").exists()
        assert first.poll() is None
        wait_ready(first, f"http://127.0.0.1:{port}", 60)
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        first.kill()
        first.wait(timeout=30)


def test_a_port_taken_while_the_engine_loads_fails_the_start(tmp_path):
    """Bound but not listening while its engine loads, the port can be taken by a program that binds with
    SO_REUSEADDR (another server on 0.0.0.0, say): uvloop then served nothing, silently. Exit 3, saying why."""
    import os
    import socket
    import time

    from servers import free_port

    port = free_port()
    proc = subprocess.Popen([*HYOCR, "serve", "--engine", "fake", "--model", "start_delay=4", "--no-ui", "--port",
                             str(port)], env={**os.environ, "HYOCR_DATA_DIR": str(tmp_path / "data")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    intruder = socket.socket()
    try:
        intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 30
        while True:  # a plain bind fails once hyocr holds the port
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    break
            assert time.monotonic() < deadline and proc.poll() is None, "hyocr did not take its port"
            time.sleep(0.05)
        intruder.bind(("127.0.0.1", port))
        intruder.listen()
        assert proc.wait(timeout=60) == 3
        output = proc.stdout.read()
        assert f"cannot listen on 127.0.0.1:{port}" in output and "Traceback" not in output, output
        assert "Uvicorn running" not in output
    finally:
        intruder.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
