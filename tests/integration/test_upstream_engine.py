"""``--engine openai`` against real OpenAI-compatible servers on loopback.

The happy path fronts a second hyocr server (its fake engine records what it receives); fault
injection uses a scripted socket server that answers 429s, dies mid-stream, or refuses.
"""

from __future__ import annotations

import base64
import json
import socket
import time

import pytest
import requests
from imaging import card
from servers import RawHttpServer, http_response

from hyocr.engines.fake import FakeEngine, FakeScript

IMAGE = base64.b64encode(card().png()).decode()


def _chat(url: str, text: str, image: str = IMAGE, **extra) -> requests.Response:
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
        {"type": "text", "text": text}]}], **extra}
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=30, stream=bool(extra.get("stream")))


@pytest.fixture
def chain(fake_server_factory):
    """(front hyocr with --engine openai, upstream hyocr with a fake engine)."""
    upstream_engine = FakeEngine(FakeScript(token_delay=0.002), model="tencent/HunyuanOCR")
    upstream = fake_server_factory(upstream_engine)
    front = fake_server_factory(engine="openai", upstream_url=upstream.url)
    return front, upstream


def test_an_upstream_hyocrs_passed_deadline_is_a_504_tried_once(fake_server_factory):
    # An upstream hyocr answers a stream whose deadline passes before its first token with a 504 request_timeout:
    # the request had its time there, so the front neither retries it nor calls the upstream overloaded
    upstream_engine = FakeEngine(FakeScript())
    upstream = fake_server_factory(upstream_engine, request_timeout=1.0, stall_timeout=0)
    front = fake_server_factory(engine="openai", upstream_url=upstream.url, request_timeout=20)
    started = time.monotonic()
    r = _chat(front.url, "[[fake:hang]]")
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
    assert "deadline" in r.json()["error"]["message"]
    assert time.monotonic() - started < 5  # one upstream deadline, not three
    assert len(upstream_engine.aborted) + len(upstream_engine.completed) == 1


def test_requests_reach_the_upstream_in_the_official_shape(chain):
    front, upstream = chain
    small = base64.b64encode(_png_200x100()).decode()
    r = requests.post(f"{front.url}/v1/ocr", json={"image": small, "task": "document", "top_k": 1}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["engine"] == "openai" and body["model"] == "tencent/HunyuanOCR"
    assert body["pages"][0]["markdown"].startswith("# Fake document")
    assert (body["pages"][0]["width"], body["pages"][0]["height"]) == (200, 100)  # the client's image
    seen = upstream.engine.requests[-1]
    assert seen.system == "" and seen.prompt.startswith("提取文档图片中正文的所有信息")
    # resized up to HunyuanOCR's minimum pixels on a 32-pixel grid before it left hyocr
    assert (seen.images[0].width, seen.images[0].height) == (736, 384)
    assert seen.sampling.temperature == 0.0 and seen.sampling.top_k == 1
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0


def _png_200x100() -> bytes:
    import io

    buf = io.BytesIO()
    card().image.resize((200, 100)).save(buf, "PNG")
    return buf.getvalue()


def test_spotting_boxes_are_relative_to_the_clients_image(chain):
    front, _ = chain
    r = requests.post(f"{front.url}/v1/ocr", json={"image": IMAGE, "task": "spotting"}, timeout=30)
    blocks = r.json()["pages"][0]["blocks"]
    assert blocks[0]["box"] == [102.4, 64.0, 512.0, 128.0]  # (100,100),(500,200) of 1024x640


def test_streaming_passes_through_and_extraction_is_parsed(chain):
    front, _ = chain
    r = _chat(front.url, "提取图片中的: ['name','id'] 的字段内容，并按照 JSON 格式返回。", stream=True)
    lines = [ln for ln in r.iter_lines(decode_unicode=True) if ln]
    assert lines[-1] == "data: [DONE]"
    text = "".join(json.loads(ln[6:])["choices"][0]["delta"].get("content", "")
                   for ln in lines[:-1] if json.loads(ln[6:]).get("choices"))
    assert json.loads(text.strip("`json\n")) == {"name": "fake name", "id": "fake id"}
    ext = requests.post(f"{front.url}/v1/ocr", json={"image": IMAGE, "task": "extract", "fields": "name,id"}, timeout=30)
    assert ext.json()["pages"][0]["fields"] == {"name": "fake name", "id": "fake id"}


def test_client_disconnect_aborts_the_upstream_request(fake_server_factory):
    upstream_engine = FakeEngine(FakeScript(token_delay=0.05))
    upstream = fake_server_factory(upstream_engine)
    front = fake_server_factory(engine="openai", upstream_url=upstream.url)
    with _chat(front.url, "[[fake:loop]] go", stream=True) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    deadline = time.monotonic() + 5
    while not upstream_engine.aborted and time.monotonic() < deadline:
        time.sleep(0.05)
    assert upstream_engine.aborted and not upstream_engine.active


# ---------------------------------------------------------------- fault injection


class ScriptedUpstream(RawHttpServer):
    """Lists one model; answers each other connection with the next scripted raw HTTP response."""

    def __init__(self, script: list[bytes | None]) -> None:
        self.script = list(script)
        super().__init__(self._next)

    def _next(self, head: bytes, body: bytes) -> bytes | None:
        if head.startswith(b"GET /v1/models"):
            return _response(200, json.dumps({"data": [{"id": "scripted"}]}).encode())
        return self.script.pop(0) if self.script else None


_response = http_response


def _sse_head() -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def _sse(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}).encode() + b"\n\n"


GOOD_STREAM = _sse_head() + _sse("hello ") + _sse("world") + (
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":700,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)


@pytest.fixture
def scripted(fake_server_factory):
    made = []

    def make(script):
        upstream = ScriptedUpstream(script)
        made.append(upstream)
        return upstream, fake_server_factory(engine="openai", upstream_url=upstream.url)

    yield make
    for upstream in made:
        upstream.close()


def test_429_and_503_before_output_are_retried(scripted):
    upstream, front = scripted([
        _response(429, b'{"error":{"message":"slow down"}}', "Retry-After: 0\r\n"),
        _response(503, b"{}", "Retry-After: \u00b2\r\n"),  # a superscript: str.isdigit() says yes, float() no
        GOOD_STREAM,
    ])
    r = _chat(front.url, "vqa?")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "hello world"
    assert body["usage"] == {"prompt_tokens": 700, "completion_tokens": 2, "total_tokens": 702}


def test_upstream_dying_mid_stream_is_an_error_not_a_hang(scripted):
    cut = _sse_head() + _sse("partial ")
    upstream, front = scripted([cut, cut])
    started = time.monotonic()
    r = _chat(front.url, "q")
    assert r.status_code == 500 and r.json()["error"]["type"] == "engine_error"
    events = [ln for ln in _chat(front.url, "q", stream=True).iter_lines(decode_unicode=True) if ln]
    assert events[-1] == "data: [DONE]" and "engine_error" in events[-2]
    assert time.monotonic() - started < 10


def test_unreachable_upstream_fails_fast_and_opens_the_breaker(fake_server_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    front = fake_server_factory(engine="openai", upstream_url=dead, upstream_retries=0)
    assert requests.get(f"{front.url}/ready", timeout=10).status_code == 503
    codes = []
    for _ in range(6):
        r = _chat(front.url, "q")
        assert r.status_code == 503
        codes.append(r.json()["error"]["code"])
    assert codes[:5] == ["upstream_unreachable"] * 5
    assert codes[5] == "circuit_open" and r.headers["retry-after"].isdigit()


def test_upstream_refusal_is_passed_on_as_a_400_and_does_not_trip_the_breaker(scripted):
    refusal = _response(400, b'{"error":{"message":"prompt is longer than the context (32768)"}}')
    upstream, front = scripted([refusal] * 6 + [GOOD_STREAM])
    for _ in range(6):
        r = _chat(front.url, "q")
        assert r.status_code == 400 and "longer than the context" in r.json()["error"]["message"]
    assert _chat(front.url, "q").status_code == 200


def test_a_probe_that_ends_without_an_answer_does_not_wedge_the_breaker(scripted):
    """Half-open lets one probe through. A probe whose event is not JSON re-opens the breaker; a probe whose
    caller hangs up before the upstream answers releases it. Either way a later request probes again and,
    the upstream well, closes it (the probe's end went unrecorded: every request was a 503 until restart)."""
    garbage = _sse_head() + b"data: <html>not json</html>\n\n"
    hang = {"left": 1}

    upstream, front = scripted([_response(500, b"{}")] * 5 + [garbage, "hang", GOOD_STREAM, GOOD_STREAM])
    answer = upstream.answer

    def slow(head: bytes, body: bytes):
        reply = answer(head, body)
        if reply == "hang":  # the upstream holds this request past the client's patience
            time.sleep(2.0)
            hang["left"] -= 1
            return None
        return reply

    upstream.answer = slow
    breaker = front.engine.breaker
    breaker.reset_timeout = 0.5
    for _ in range(5):
        assert _chat(front.url, "q").status_code == 500
    assert _chat(front.url, "q").json()["error"]["code"] == "circuit_open"
    time.sleep(0.6)
    probe = _chat(front.url, "q")  # not JSON: a failure, open again
    assert probe.status_code == 500 and breaker.state == "open"
    time.sleep(0.6)
    with pytest.raises(requests.exceptions.ReadTimeout):  # this probe's caller leaves
        requests.post(f"{front.url}/v1/chat/completions", timeout=0.5, json={"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGE}},
            {"type": "text", "text": "q"}]}]})
    deadline = time.monotonic() + 10
    while hang["left"] and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)
    recovered = _chat(front.url, "q")
    assert recovered.status_code == 200, recovered.text
    assert breaker.state == "closed" and _chat(front.url, "q").status_code == 200
