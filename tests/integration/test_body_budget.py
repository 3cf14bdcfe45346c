"""The process-wide body budget (api/limits.py) over real HTTP: concurrent large bodies past it are a 503
``server_busy`` with Retry-After while the server stays healthy, small bodies always pass, and every request's
bytes are given back however it ends (answered, refused, or the client gone mid-upload). A small budget
(monkeypatched) keeps it fast and light."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import io
import json
import socket
import threading
import time

import numpy as np
import pytest
import requests
from imaging import card
from PIL import Image

from hyocr.api import limits

CAP = 2 * 1024 * 1024  # MAX_BODY_BYTES of these servers
MULTIPLE = 2  # the budget: 4 MiB
SMALL = 512 * 1024


class Recorded(limits.BodyBudget):
    """The real budget, remembered (so the test can read it) and its peak kept."""

    made: list[Recorded] = []

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.peak = 0
        Recorded.made.append(self)

    def take(self, size: int, held_after: int) -> bool:
        ok = super().take(size, held_after)
        self.peak = max(self.peak, self.in_flight)
        return ok


@pytest.fixture
def budget_server(fake_server_factory, monkeypatch):
    monkeypatch.setattr(limits, "BODY_BUDGET_MULTIPLE", MULTIPLE)
    monkeypatch.setattr(limits, "SMALL_BODY_BYTES", SMALL)
    monkeypatch.setattr(limits, "BodyBudget", Recorded)
    Recorded.made.clear()
    server = fake_server_factory(ui=False, max_body_bytes=CAP, file_max_bytes=CAP // 2)
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200  # builds the middleware stack
    (budget,) = Recorded.made
    assert budget.limit == MULTIPLE * CAP and budget.in_flight == 0
    return server, budget


def _upload() -> tuple[bytes, bytes]:
    """A /v1/ocr multipart upload of a ~1.3 MB noise PNG, as raw HTTP: (head, body)."""
    pixels = np.random.default_rng(0).integers(0, 256, (660, 660, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    files = {"file": ("noise.png", buf.getvalue(), "image/png")}
    prepared = requests.Request("POST", "http://x/v1/ocr", files=files).prepare()
    body = prepared.body
    head = (f"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: {prepared.headers['Content-Type']}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head, body


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def _read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "closed mid-response"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _assert_busy(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503, body[:300]
    assert headers.get("retry-after") == str(limits.BODY_BUDGET_RETRY_AFTER)
    assert headers.get("content-type") == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "server_busy" and error["type"] == "service_unavailable", error


def test_bodies_past_the_budget_are_503_while_small_requests_and_health_pass(budget_server):
    server, budget = budget_server
    head, body = _upload()
    assert SMALL < len(body) < CAP and 3 * len(body) < budget.limit < 4 * len(body)
    holders = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)]
    try:
        for sock in holders:  # three uploads in flight, each all but its last bytes
            sock.sendall(head + body[:-10])
        _until(lambda: budget.in_flight == 3 * (len(body) - 10))

        # A fourth large upload would pass the budget: refused, after its body was read (no reset), with
        # Retry-After in the OpenAI error shape; what it held is given back.
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as late:
            late.sendall(head + body)
            _assert_busy(*_read_reply(late))
        _until(lambda: budget.in_flight == 3 * (len(body) - 10))
        assert budget.peak <= budget.limit + SMALL  # its first SMALL bytes passed as any body's do

        # Meanwhile the server is healthy, and a small request is served although it does not fit what is left
        # of the budget: the first SMALL_BODY_BYTES of any body always pass.
        assert requests.get(f"{server.url}/health", timeout=10).status_code == 200
        image = base64.b64encode(card().png()).decode()
        small = json.dumps({"image": image, "task": "text"}).encode().ljust(400_000)  # JSON whitespace
        assert budget.in_flight + len(small) > budget.limit
        r = requests.post(f"{server.url}/v1/ocr", data=small, timeout=30,
                          headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text

        # The held uploads finish and are answered; every byte goes back.
        for sock in holders:
            sock.sendall(body[-10:])
        for sock in holders:
            status, _, reply = _read_reply(sock)
            assert status == 200, reply[:300]
    finally:
        for sock in holders:
            sock.close()
    _until(lambda: budget.in_flight == 0)

    scrape = requests.get(f"{server.url}/metrics", timeout=10).text
    assert 'hyocr_rejected_total{reason="body_budget"} 1.0' in scrape  # the refusal is counted as a shed

    # With the budget free again, a large request is accepted.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        status, _, reply = _read_reply(sock)
    assert status == 200, reply[:300]
    _until(lambda: budget.in_flight == 0)


def test_a_flood_of_large_uploads_is_held_to_the_budget(budget_server, monkeypatch):
    # The reported attack, scaled down: many large bodies at once from one caller, sent slowly so that they
    # overlap. Each is answered (200 or 503 server_busy, never a reset or a 500), the bytes held never pass
    # the budget (but for each body's small allowance), /health answers throughout, nothing stays counted.
    server, budget = budget_server
    monkeypatch.setattr(limits, "SMALL_BODY_BYTES", 64 * 1024)
    head, body = _upload()
    pieces = [body[i:i + 128 * 1024] for i in range(0, len(body), 128 * 1024)]
    stop = threading.Event()
    health: list[int] = []

    def probe() -> None:
        while not stop.is_set():
            health.append(requests.get(f"{server.url}/health", timeout=10).status_code)
            time.sleep(0.1)

    def flood(_: int) -> int:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            try:
                sock.sendall(head)
                for piece in pieces:
                    sock.sendall(piece)
                    time.sleep(0.05)
            except OSError:  # answered and closed while still sending: the answer is read below
                pass
            status, headers, reply = _read_reply(sock)
        if status != 200:
            _assert_busy(status, headers, reply)
        return status

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(flood, range(8)))
    finally:
        stop.set()
        prober.join(timeout=15)
    assert 503 in statuses and 200 in statuses, statuses
    assert budget.peak <= budget.limit + 8 * 64 * 1024 < 8 * len(body)
    assert health and set(health) == {200}
    _until(lambda: budget.in_flight == 0)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_client_that_leaves_mid_upload_gives_its_bytes_back(budget_server, how):
    server, budget = budget_server
    head, body = _upload()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(head + body[: len(body) // 2])
    _until(lambda: budget.in_flight == len(body) // 2)
    if how == "reset":  # RST instead of FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
    started = time.monotonic()
    _until(lambda: budget.in_flight == 0)
    assert time.monotonic() - started < 10  # the disconnect, not the 60 s body timeout, gave them back
    with contextlib.closing(socket.create_connection(("127.0.0.1", server.port), timeout=30)) as again:
        again.sendall(head + body)  # the whole budget is there again
        status, _, reply = _read_reply(again)
    assert status == 200, reply[:300]
