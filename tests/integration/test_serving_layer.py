"""The serving layer (routes, service, streaming, cancellation, errors) over real HTTP, with the
scriptable fake engine standing in for a model. Nothing here claims OCR works: see test_ocr_api."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import socket
import time

import pytest
import requests
from imaging import card

from hyocr.engines.fake import FakeEngine, FakeScript

IMAGE = "data:image/png;base64," + base64.b64encode(card().png()).decode()


def _chat(url: str, text: str, **extra) -> requests.Response:
    body = {
        "messages": [
            {"role": "system", "content": ""},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}}, {"type": "text", "text": text}]},
        ],
        **extra,
    }
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=30, stream=bool(extra.get("stream")))


def _events(r: requests.Response) -> list:
    out = []
    for line in r.iter_lines(decode_unicode=True):
        if line:
            payload = line.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_prompt_reaches_engine_verbatim_with_empty_system_message(fake_server_factory):
    server = fake_server_factory()
    r = _chat(server.url, "提取文档图片中正文的所有信息用 markdown 格式表示")
    assert r.status_code == 200, r.text
    request = server.engine.requests[-1]
    assert request.system == "" and request.prompt.startswith("提取文档图片中正文")
    assert len(request.images) == 1 and request.images[0].width == 1024
    assert request.sampling.max_tokens == 4096  # the server default


def test_streaming_order_usage_and_done(fake_server_factory):
    server = fake_server_factory()
    r = _chat(server.url, "提取图中的文字。", stream=True, stream_options={"include_usage": True})
    events = _events(r)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e.get("choices")]
    assert "".join(deltas) == "fake text output for a 1024x640 image"
    finals = [e for e in events[:-1] if e.get("choices") and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["hyocr"]["task"] == "text"
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == len([d for d in deltas if d])  # one fake token per chunk
    assert usage["prompt_tokens"] > 64  # the image is charged


def test_document_and_extraction_results_are_structured(fake_server_factory):
    server = fake_server_factory()
    url = f"{server.url}/v1/ocr"
    doc = requests.post(url, json={"image": IMAGE, "task": "document"}, timeout=30).json()
    assert doc["pages"][0]["markdown"].startswith("# Fake document")
    ext = requests.post(url, json={"image": IMAGE, "task": "extract", "fields": ["name", "id"]}, timeout=30)
    assert ext.status_code == 200, ext.text
    assert ext.json()["pages"][0]["fields"] == {"name": "fake name", "id": "fake id"}
    prompt = server.engine.requests[-1].prompt
    assert "['name','id']" in prompt and "JSON" in prompt
    spot = requests.post(url, json={"image": IMAGE, "task": "spotting"}, timeout=30).json()
    blocks = spot["pages"][0]["blocks"]
    # 0-1000 normalised boxes from the model converted to pixels of the 1024x640 image
    assert blocks[0]["text"] == "HYOCR FAKE" and blocks[0]["box"] == [102.4, 64.0, 512.0, 128.0]


def test_max_tokens_stops_with_length(fake_server_factory):
    server = fake_server_factory()
    r = _chat(server.url, "提取图中的文字。", max_tokens=3)
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3


def test_loop_guard_stops_a_repeating_stream(fake_server_factory):
    server = fake_server_factory()
    r = _chat(server.url, "提取图中的文字。 [[fake:loop]]")
    body = r.json()
    assert body["hyocr"]["finish_reason"] == "repetition"
    content = body["choices"][0]["message"]["content"]
    assert content.count("repeat this") < 20  # trimmed, not 400 repeats
    assert body["usage"]["completion_tokens"] < 400  # generation stopped early
    ocr = requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "vqa", "question": "? [[fake:loop]]"}, timeout=30)
    assert ocr.json()["pages"][0]["finish_reason"] == "repetition"


def test_engine_failure_is_a_500_without_internals_and_the_next_request_works(fake_server_factory):
    server = fake_server_factory()
    r = _chat(server.url, "[[fake:fail]]")
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "engine_error" and "scripted" not in err["message"]
    assert r.headers["x-request-id"] in err["message"]
    assert _chat(server.url, "hello").status_code == 200


def test_failure_mid_stream_ends_with_an_error_event(fake_server_factory):
    server = fake_server_factory()
    events = _events(_chat(server.url, "[[fake:fail_mid]]", stream=True))
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "engine_error"


def test_client_disconnect_aborts_engine_work(fake_server_factory):
    engine = FakeEngine(FakeScript(token_delay=0.05))
    server = fake_server_factory(engine)
    body = json.dumps({"stream": True, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": IMAGE}}, {"type": "text", "text": "[[fake:loop]] go"}]}]}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        assert b"200 OK" in sock.recv(4096)  # streaming has started
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(engine.aborted) == 1 and not engine.active


def test_per_page_results_in_order_and_one_bad_page_does_not_fail_the_rest(fake_server_factory):
    server = fake_server_factory()
    ok = requests.post(f"{server.url}/v1/ocr", json={"images": [IMAGE, IMAGE, IMAGE], "task": "text"}, timeout=30)
    assert [p["index"] for p in ok.json()["pages"]] == [0, 1, 2]
    ids = [r.request_id for r in list(server.engine.requests)[-3:]]
    assert len(set(ids)) == 3  # each page is its own engine request (batched by the engine)
    too_many = requests.post(f"{server.url}/v1/ocr", json={"images": [IMAGE] * 9}, timeout=30)
    assert too_many.status_code == 400 and "at most 8" in too_many.json()["error"]["message"]


def test_request_id_is_honoured_or_generated(fake_server_factory):
    server = fake_server_factory()
    r = requests.get(f"{server.url}/health", headers={"X-Request-ID": "trace-123"}, timeout=5)
    assert r.headers["x-request-id"] == "trace-123"
    r = requests.get(f"{server.url}/health", headers={"X-Request-ID": "bad id\twith junk"}, timeout=5)
    assert r.headers["x-request-id"] != "bad id\twith junk" and len(r.headers["x-request-id"]) == 32


def test_health_ready_and_unknown_routes(fake_server_factory):
    server = fake_server_factory()
    assert requests.get(f"{server.url}/health", timeout=5).json() == {"status": "ok"}
    ready = requests.get(f"{server.url}/ready", timeout=5)
    assert ready.status_code == 200 and ready.json()["engine"] == "fake"
    missing = requests.get(f"{server.url}/v2/nothing", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    wrong_method = requests.get(f"{server.url}/v1/ocr", timeout=5)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    for path in ("/health", "/ready", "/v1/models"):  # uptime monitors probe with HEAD (was 405: "down")
        head = requests.head(f"{server.url}{path}", timeout=5)
        assert head.status_code == 200 and head.content == b"", path


def test_nullable_openai_fields_sent_as_null_take_their_defaults(fake_server_factory):
    server = fake_server_factory()
    image = {"type": "image_url", "image_url": {"url": IMAGE}}
    chat = requests.post(f"{server.url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": [image]}], "stream": None, "n": None})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
    done = requests.post(f"{server.url}/v1/completions", timeout=30, json={
        "prompt": "", "image": IMAGE, "echo": None, "stream": None, "ignore_eos": None})
    assert done.status_code == 200 and done.json()["object"] == "text_completion", done.text


def test_client_hanging_up_on_a_plain_request_aborts_engine_work(fake_server_factory):
    """Non-streaming requests too: a client that times out and leaves stops costing engine time."""
    engine = FakeEngine()
    server = fake_server_factory(engine)
    with contextlib.suppress(requests.Timeout):
        requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "vqa", "question": "[[fake:hang]]"},
                      timeout=0.5)
    deadline = time.monotonic() + 5
    while engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.active and len(engine.aborted) == 1
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_dead_engine_is_detected_in_flight_requests_fail_fast_and_it_is_restarted(fake_server_factory):
    engine = FakeEngine(FakeScript(latency=0.2))
    server = fake_server_factory(engine, request_timeout=60)
    assert requests.get(f"{server.url}/ready", timeout=5).json()["restarts"] == 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(requests.post, f"{server.url}/v1/ocr",
                                json={"image": IMAGE, "task": "vqa", "question": "[[fake:hang]]"}, timeout=30)
        wait_until = time.monotonic() + 10  # in the engine (preparing an image can take a while on a loaded machine)
        while not engine.active:
            assert time.monotonic() < wait_until, "the request never reached the engine"
            time.sleep(0.02)
        engine.kill()  # the engine process "dies" with a request in it
        started = time.monotonic()
        r = in_flight.result()
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_restarting"  # within seconds, not a hang
    assert int(r.headers["Retry-After"]) > 0 and time.monotonic() - started < 5
    deadline = time.monotonic() + 10
    while requests.get(f"{server.url}/ready", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the engine was not restarted"
        time.sleep(0.1)
    assert engine.starts == 2 and requests.get(f"{server.url}/ready", timeout=5).json()["restarts"] == 1
    assert requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30).status_code == 200


def test_a_stalled_engine_is_restarted_by_the_watchdog(fake_server_factory):
    engine = FakeEngine()
    server = fake_server_factory(engine, request_timeout=60, stall_timeout=1.0)
    started = time.monotonic()
    r = requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "vqa", "question": "[[fake:hang]]"},
                      timeout=30)
    assert r.status_code == 503 and time.monotonic() - started < 6  # not the 60 s deadline
    assert r.json()["error"]["code"] == "engine_restarting" and int(r.headers["Retry-After"]) > 0
    assert engine.starts == 2
    assert requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30).status_code == 200


class _BrokenEngine(FakeEngine):
    """Fails the way a bug does: an exception that is not one of hyocr's errors."""

    async def generate(self, request):
        raise KeyError("a bug, not an engine error")
        yield  # an async generator, as engines are


def _raw(port: int, head: bytes, body: bytes = b"", *, timeout: float = 15) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        data = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                data += chunk
        return data


def test_an_unexpected_error_is_a_json_500_and_the_connection_stays_usable(fake_server_factory):
    server = fake_server_factory(_BrokenEngine(FakeScript()))
    with requests.Session() as session:
        r = session.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30)
        assert r.status_code == 500
        err = r.json()["error"]
        assert err["type"] == "internal_error" and "bug" not in err["message"]
        assert r.headers["x-request-id"] in err["message"]
        # The same keep-alive connection answers the next request (Starlette's last resort dropped it).
        assert session.get(f"{server.url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("path", ["/v1/ocr", "/v1/chat/completions", "/v1/completions"])
def test_a_body_that_never_arrives_gets_a_408_not_a_held_connection(fake_server_factory, path):
    # chat and completions: FastAPI reads their pydantic bodies itself and made the timeout a 400
    server = fake_server_factory(body_timeout=1)
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n").encode()
    started = time.monotonic()
    reply = _raw(server.port, head, b'{"image":')
    assert time.monotonic() - started < 10
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), reply[:200]
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_timeout"
    # A complete body, however slow its parts, is served as before.
    assert _chat(server.url, "hello").status_code == 200


@pytest.mark.parametrize("path", ["/v1/ocr", "/v1/chat/completions", "/v1/completions"])
def test_a_chunked_body_past_the_cap_is_a_413_on_every_route(fake_server_factory, path):
    server = fake_server_factory(max_body_bytes=200_000)  # no Content-Length: counted as it streams
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    chunks = [b'{"model": "x", "prompt": "'] + [b"a" * 65536] * 5
    reply = _raw(server.port, head, b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks))
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), reply[:300]
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_client_still_sending_past_the_cap_reads_its_413_not_a_reset(fake_server_factory, framing):
    # CI saw the 413 lost: the server answered and closed with the client's bytes unread, the kernel reset the
    # connection and the client's stack dropped the answer. A client that is slow to finish makes that certain.
    server = fake_server_factory(max_body_bytes=200_000)
    parts = [b'{"model": "x", "prompt": "' + b"a" * 250_000, b"a" * 65536, b"a" * 65536 + b'"}']
    if framing == "chunked":
        head = "Transfer-Encoding: chunked"
        pieces = [b"%x\r\n%s\r\n" % (len(p), p) for p in parts] + [b"0\r\n\r\n"]
    else:
        head = f"Content-Length: {sum(map(len, parts))}"
        pieces = parts
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}\r\n\r\n"
                     .encode())
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.3)
        reply = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                reply += chunk
    assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "payload_too_large"


def test_a_compressed_body_is_a_415_that_says_so(fake_server_factory):
    # A gzip body read as JSON was a 400 "invalid JSON" that sent users looking at their JSON.
    import gzip

    import requests

    server = fake_server_factory()
    body = gzip.compress(json.dumps({"prompt": "hi"}).encode())
    for path in ("/v1/completions", "/v1/ocr", "/v1/files"):
        r = requests.post(f"{server.url}{path}", data=body, timeout=10,
                          headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_content_encoding", r.text
        assert "gzip" in r.json()["error"]["message"]
    plain = requests.post(f"{server.url}/v1/completions", json={"prompt": "hi"}, timeout=10,
                          headers={"Content-Encoding": "identity"})  # read: the route's own answer
    assert plain.json()["error"]["code"] == "missing_image", plain.text
    assert requests.get(f"{server.url}/health", headers={"Content-Encoding": "gzip"}, timeout=10).status_code == 200
    # two lines, the last "identity": the gzip one still counts (raw, as requests would merge them)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Encoding: gzip\r\nContent-Encoding: identity\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 415"), reply[:200]


def test_a_client_leaving_mid_body_is_a_499_not_an_error(fake_server_factory, caplog):
    server = fake_server_factory()
    head = (b"POST /v1/ocr HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n")
    with caplog.at_level("INFO"):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(head + b'{"image":"')
            time.sleep(0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(getattr(r, "fields", {}).get("status") == 499
                                                      for r in caplog.records):
            time.sleep(0.1)
    statuses = [getattr(r, "fields", {}).get("status") for r in caplog.records if r.name == "hyocr.access"]
    assert 499 in statuses, statuses
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


def test_a_request_queued_past_queue_timeout_is_shed_with_a_503(fake_server_factory):
    server = fake_server_factory(max_concurrency=1, queue_timeout=0.5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(_chat, server.url, "[[fake:delay=3]]")
        time.sleep(0.5)  # the holder has the one slot
        started = time.monotonic()
        r = _chat(server.url, "hello")
        waited = time.monotonic() - started
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout", r.text
        assert r.headers["retry-after"] == "1" and waited < 2.5
        assert holder.result().status_code == 200  # the admitted request is unaffected
    metrics = requests.get(f"{server.url}/metrics", timeout=10).text
    assert 'hyocr_rejected_total{reason="queue_timeout"} 1.0' in metrics
