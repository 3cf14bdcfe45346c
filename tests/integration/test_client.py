"""hyocr.client against real servers on loopback: real OCR with rapidocr, the serving behaviours with the
scriptable fake engine, and a scripted HTTP server for what the fake engine cannot do (503s)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from imaging import card, overlap, squash
from servers import free_port

from hyocr.client import (
    APIError,
    AsyncHyocrClient,
    BadRequest,
    ConnectionFailed,
    HyocrClient,
    ServerError,
    Timeout,
)


def test_ocr_reads_the_card_with_pixel_boxes(rapid_server, tmp_path):
    rendered = card()
    path = tmp_path / "card.png"
    path.write_bytes(rendered.png())
    with HyocrClient(rapid_server.url, timeout=30) as client:
        result = client.ocr(path)  # a path: uploaded as multipart
        assert client.health() and client.ready()
        assert client.models()[0]["id"] == result.model
    assert (result.engine, result.task, result.requested_task) == ("rapidocr", "spotting", "spotting")
    page = result.pages[0]
    assert (page.width, page.height) == rendered.image.size and page.finish_reason == "stop"
    for line, drawn in zip(rendered.lines, rendered.boxes, strict=True):
        assert squash(line.text) in squash(result.text)
        hits = [b for b in page.blocks if overlap(b.box, drawn) > 0.6]
        assert hits and squash(line.text) in squash(" ".join(b.text for b in hits)), (line, page.blocks)
        assert all(0 <= b.score <= 1 and len(b.polygon) == 4 for b in hits)
    assert result.raw["pages"][0]["blocks"][0]["text"] == page.blocks[0].text


def test_bad_file_is_a_bad_request_with_message_and_param(rapid_server):
    with HyocrClient(rapid_server.url, timeout=30) as client, pytest.raises(BadRequest) as info:
        client.ocr(b"hello, I am text")
    err = info.value
    assert (err.status, err.code, err.param) == (400, "invalid_image", "file")
    assert err.type == "invalid_request_error"
    assert "not a recognised image" in err.message and err.attempts == 1
    assert err.request_id and err.request_id.endswith(".1")  # the id we sent, honoured by the server


def test_unsupported_task_on_rapidocr_is_a_bad_request(rapid_server):
    with HyocrClient(rapid_server.url, timeout=30) as client, pytest.raises(BadRequest) as info:
        client.ocr(card().png(), task="document")
    assert info.value.code == "unsupported_task" and info.value.param == "task"
    assert "rapidocr" in info.value.message


def test_engine_failure_is_a_server_error_and_not_retried(fake_server_factory):
    server = fake_server_factory()
    with HyocrClient(server.url) as client, pytest.raises(ServerError) as info:
        client.ocr(card().png(), task="vqa", question="[[fake:fail]]")
    assert info.value.status == 500 and info.value.type == "engine_error" and info.value.attempts == 1
    assert len(server.engine.requests) == 1  # a 500 may have done work: never repeated


def test_timeout_after_every_attempt(fake_server_factory):
    server = fake_server_factory()
    started = time.monotonic()
    with HyocrClient(server.url, timeout=0.5, backoff=0.05) as client, pytest.raises(Timeout) as info:
        client.ocr(card().png(), task="vqa", question="[[fake:delay=1]]")
    elapsed = time.monotonic() - started
    assert info.value.attempts == 3 and len(server.engine.requests) == 3  # max_retries + 1
    assert 1.5 <= elapsed < 3.0


@pytest.mark.parametrize("client_class", [HyocrClient, AsyncHyocrClient])
def test_a_document_longer_than_the_timeout_is_read_when_each_page_is_within_it(fake_server_factory, tmp_path,
                                                                                client_class):
    # A PDF of twenty small pages, two at a time (the fake engine's two workers) at 0.3 s each: ~3 s in all
    # against a 2 s timeout, each page's wait well within it (margins for a loaded 2-core machine). Timed whole,
    # it failed and was read again by each retry; a document is read as the page stream, the timeout bounds
    # each page's wait, and the caller gets the whole result without asking for pages.
    import asyncio

    from pdfs import text_pdf

    server = fake_server_factory()
    path = tmp_path / "twenty.pdf"
    path.write_bytes(text_pdf([[f"page {n}"] for n in range(20)], page_size=(200, 120)))
    options = {"task": "vqa", "question": "[[fake:busy=0.3]]"}
    with HyocrClient(server.url, timeout=60) as client:  # the PDF renderer's processes started
        client.ocr(text_pdf([["warm"]]), task="vqa", question="x")
    server.engine.requests.clear()
    started = time.monotonic()
    if client_class is HyocrClient:
        with HyocrClient(server.url, timeout=2.0, backoff=0.05) as client:
            result = client.ocr(path, **options)
    else:
        async def read():
            async with AsyncHyocrClient(server.url, timeout=2.0, backoff=0.05) as client:
                return await client.ocr(path.read_bytes(), **options)
        result = asyncio.run(read())
    assert time.monotonic() - started > 2.0  # longer than the timeout in all
    assert [p.index for p in result.pages] == list(range(20)) and len(server.engine.requests) == 20  # no retry
    assert "stream" not in result.raw  # the body as a non-streamed call gets it



class CountingTransport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        return super().handle_request(request)


def test_connection_refused_is_retried_then_connection_failed():
    transport = CountingTransport()
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with HyocrClient(url, transport=transport, backoff=0.05) as client:
        with pytest.raises(ConnectionFailed) as info:
            client.ocr(b"img")
        assert info.value.attempts == 3 == transport.attempts
        assert time.monotonic() - started < 1.0
        assert client.health() is False and client.ready() is False and transport.attempts == 5


class Scripted(ThreadingHTTPServer):
    """Answers POST /v1/ocr from a script of (status, headers, body); records the request headers."""

    def __init__(self, script: list[tuple[int, dict[str, str], dict]]) -> None:
        self.script, self.seen = script, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                server.seen.append((time.monotonic(), dict(self.headers)))
                status, headers, body = server.script.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in {**headers, "content-type": "application/json"}.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def scripted() -> Iterator:
    servers: list[Scripted] = []

    def make(script: list) -> Scripted:
        server = Scripted(script)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


OCR_BODY = {
    "id": "ocr-x", "object": "ocr.result", "created": 1, "model": "m", "engine": "e", "task": "text",
    "requested_task": "text", "text": "OK", "usage": {}, "timings": {},
    "pages": [{"index": 0, "width": 4, "height": 4, "text": "OK", "blocks": [], "finish_reason": "stop"}],
}
BUSY = (503, {"Retry-After": "1"}, {"error": {"message": "overloaded", "type": "service_unavailable",
                                              "param": None, "code": None}})


def test_503_with_retry_after_is_waited_out_then_succeeds(scripted):
    server = scripted([BUSY, (200, {}, OCR_BODY)])
    with HyocrClient(server.url) as client:
        assert client.ocr(b"img").text == "OK"
    (first, h1), (second, h2) = server.seen
    # Retry-After: 1, honoured (a wait of 1-1.3 s; the bound leaves room for a loaded CI machine, and stays
    # below what a misread header would give: the 10 s cap or a backoff ignoring it)
    assert 0.95 <= second - first < 4.0
    assert h1["X-Request-ID"].removesuffix(".1") == h2["X-Request-ID"].removesuffix(".2")


async def test_async_client_parity(fake_server_factory, scripted):
    server = fake_server_factory()
    png = card().png()
    async with AsyncHyocrClient(server.url) as client:
        assert await client.health() and await client.ready()
        result = await client.ocr_many([png, png], task="extract", fields="name,id")
        assert [p.fields for p in result.pages] == [{"name": "fake name", "id": "fake id"}] * 2
        with pytest.raises(ServerError):
            await client.ocr(png, task="vqa", question="[[fake:fail]]")
        assert len(server.engine.requests) == 3  # two pages, then one failure not retried
    busy = scripted([BUSY, (200, {}, OCR_BODY)])
    async with AsyncHyocrClient(busy.url) as client:
        assert (await client.ocr(png)).text == "OK" and len(busy.seen) == 2


async def test_each_caller_gets_its_own_webhook_secret(fake_server_factory):
    server = fake_server_factory(ui=False, api_keys="key-one,key-two")
    with HyocrClient(server.url, api_key="key-one") as one:
        mine = one.webhook_secret()
    async with AsyncHyocrClient(server.url, api_key="key-two") as two:
        theirs = await two.webhook_secret()
    assert mine.startswith("whsec_") and theirs.startswith("whsec_") and mine != theirs
    with HyocrClient(server.url, api_key="key-one") as again:
        assert again.webhook_secret() == mine  # stable: receivers keep it


class Raw(ThreadingHTTPServer):
    """Answers every request with ``reply(handler)``: raw bytes at its own pace (a slow proxy, a cut stream)."""

    def __init__(self, reply) -> None:
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                server.requests += 1
                with contextlib.suppress(OSError):
                    reply(self.wfile)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


def _trickle(out) -> None:
    """Headers at once, then the body a byte every 0.2 s: each read is quick, the answer never whole."""
    body = json.dumps(OCR_BODY).encode()
    out.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    out.flush()
    for byte in body:
        out.write(bytes([byte]))
        out.flush()
        time.sleep(0.2)


async def test_a_trickling_answer_is_bounded_by_the_timeout_not_each_read():
    server = Raw(_trickle)
    try:
        started = time.monotonic()
        with HyocrClient(server.url, timeout=1.0, max_retries=1, backoff=0.05) as client, pytest.raises(Timeout):
            client.ocr(b"img")
        assert time.monotonic() - started < 4.0 and server.requests == 2  # ~1 s an attempt, not 50 s of bytes
        started = time.monotonic()
        async with AsyncHyocrClient(server.url, timeout=1.0, max_retries=0) as client:
            with pytest.raises(Timeout):
                await client.ocr(b"img")
        assert time.monotonic() - started < 3.0
    finally:
        server.shutdown()


def _heartbeats(out) -> None:
    """A page stream that sends only SSE comments (a proxy's or server's keep-alive), never a page."""
    out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    for _ in range(100):
        out.write(b": ping\n\n")
        out.flush()
        time.sleep(0.2)


async def test_heartbeats_are_no_page_and_do_not_hold_the_timeout_off():
    """The timeout bounds the wait for each page: comment lines moved it, and a dead read waited for ever."""
    server = Raw(_heartbeats)
    try:
        started = time.monotonic()
        with HyocrClient(server.url, timeout=1.0, max_retries=0) as client, pytest.raises(Timeout):
            client.ocr(b"%PDF-1.4 fake")
        assert time.monotonic() - started < 5.0  # ~1 s, not the 20 s of heartbeats
        started = time.monotonic()
        async with AsyncHyocrClient(server.url, timeout=1.0, max_retries=0) as client:
            with pytest.raises(Timeout):
                await client.ocr(b"%PDF-1.4 fake")
        assert time.monotonic() - started < 5.0
    finally:
        server.shutdown()


def _cut_after_one_page(out) -> None:
    page = {"object": "ocr.page", "completed": 1, "total": 2, "page": OCR_BODY["pages"][0]}
    out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    event = b"data: " + json.dumps(page).encode() + b"\n\n"
    out.write(b"%x\r\n%s\r\n" % (len(event), event))
    out.write(b"5\r\nda")  # the connection drops mid-chunk
    out.flush()


def test_a_stream_cut_after_a_page_is_not_retried_and_no_page_is_given_twice():
    server = Raw(_cut_after_one_page)
    seen = []
    try:
        with HyocrClient(server.url, max_retries=2, backoff=0.05) as client, pytest.raises(ConnectionFailed) as info:
            client.ocr(b"%PDF-1.4 fake", on_page=lambda page, done, total: seen.append((page.index, done, total)))
        assert seen == [(0, 1, 2)] and server.requests == 1 and "cut after 1 page" in str(info.value)
    finally:
        server.shutdown()


def test_json_of_another_shape_is_a_typed_error(scripted):
    server = scripted([(200, {}, {"unexpected": True})])
    with HyocrClient(server.url) as client, pytest.raises(APIError, match="not what hyocr sends"):
        client.ocr(b"img")


def _slow_pages(out) -> None:
    """Three pages 0.6 s apart, then the result: longer than a 1 s timeout in all, each wait shorter."""
    out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    for n in range(3):
        time.sleep(0.6)
        page = {"object": "ocr.page", "completed": n + 1, "total": 3, "page": {**OCR_BODY["pages"][0], "index": n}}
        out.write(b"data: " + json.dumps(page).encode() + b"\n\n")
        out.flush()
    out.write(b"data: " + json.dumps(OCR_BODY).encode() + b"\n\ndata: [DONE]\n\n")
    out.flush()


async def test_a_page_stream_is_bounded_by_the_wait_for_each_page_not_by_its_whole_length():
    server = Raw(_slow_pages)
    try:
        seen = []
        with HyocrClient(server.url, timeout=1.0, max_retries=0) as client:
            result = client.ocr(b"%PDF-1.4 fake", on_page=lambda page, done, total: seen.append(page.index))
        assert result.text == "OK" and seen == [0, 1, 2]
        seen.clear()
        async with AsyncHyocrClient(server.url, timeout=1.0, max_retries=0) as client:
            await client.ocr(b"%PDF-1.4 fake", on_page=lambda page, done, total: seen.append(page.index))
        assert seen == [0, 1, 2]
    finally:
        server.shutdown()
