"""hyocr.client's retry, backoff and error-mapping decisions, over httpx.MockTransport: no server, no
real sleeping (the clients take a ``sleep`` that records the waits)."""

from __future__ import annotations

import json

import httpx
import pytest

from hyocr import client as hc
from hyocr.client import AsyncHyocrClient, HyocrClient, RetryState

OCR_BODY = {
    "id": "ocr-1", "object": "ocr.result", "created": 1, "model": "m", "engine": "fake", "task": "text",
    "requested_task": "text", "text": "HELLO",
    "pages": [{"index": 0, "width": 10, "height": 5, "text": "HELLO", "finish_reason": "stop",
               "blocks": [{"text": "HELLO", "box": [1, 2, 3, 4], "score": 0.9}]}],
    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "timings": {"total_ms": 1.0},
}


def error(status: int, message: str = "nope", headers: dict | None = None, **detail) -> httpx.Response:
    body = {"error": {"message": message, "type": "t", "param": None, "code": None, **detail}}
    return httpx.Response(status, json=body, headers={"x-request-id": "rid-1", **(headers or {})})


class Script:
    """A MockTransport handler that answers from a list (the last answer repeats) and records requests."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers, self.requests = list(answers), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def make(script: Script, **kwargs) -> tuple[HyocrClient, list[float]]:
    sleeps: list[float] = []
    transport = httpx.MockTransport(script)
    client = HyocrClient("http://hyocr.test", transport=transport, sleep=sleeps.append, **kwargs)
    return client, sleeps


@pytest.mark.parametrize(
    ("status", "exc", "attempts"),
    [(400, hc.BadRequest, 1), (401, hc.AuthenticationError, 1), (403, hc.PermissionDenied, 1),
     (404, hc.NotFound, 1), (413, hc.BadRequest, 1), (415, hc.BadRequest, 1), (422, hc.BadRequest, 1),
     (500, hc.ServerError, 1), (429, hc.RateLimited, 3), (502, hc.ServiceUnavailable, 3),
     (503, hc.ServiceUnavailable, 3), (418, hc.APIError, 1),
     (504, hc.ServiceUnavailable, 1)],  # hyocr's own 504 (JSON): its request deadline passed, and would again
)
def test_attempts_and_error_class_per_status(status, exc, attempts):
    script = Script(error(status, "bad thing", param="task", code="c"))
    client, sleeps = make(script)
    with pytest.raises(exc) as info:
        client.ocr(b"img")
    err = info.value
    assert type(err) is exc and len(script.requests) == attempts == err.attempts
    assert len(sleeps) == attempts - 1
    assert (err.status, err.message, err.type, err.param, err.code) == (status, "bad thing", "t", "task", "c")
    assert err.request_id == "rid-1"  # the server's X-Request-ID, as answered


def test_transient_failure_then_success_returns_the_result():
    script = Script(error(503), httpx.ConnectError("refused"), httpx.Response(200, json=OCR_BODY))
    client, sleeps = make(script)
    result = client.ocr(b"img")
    assert result.text == "HELLO" and result.pages[0].blocks[0].box == (1, 2, 3, 4)
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_backoff_is_exponential_with_jitter_and_capped():
    script = Script(httpx.ConnectError("refused"))
    client, sleeps = make(script, max_retries=4, backoff=0.25)
    with pytest.raises(hc.ConnectionFailed) as info:
        client.ocr(b"img")
    assert info.value.attempts == 5 and len(script.requests) == 5
    for n, wait in enumerate(sleeps, start=1):
        nominal = 0.25 * 2 ** (n - 1)
        assert nominal / 2 <= wait <= nominal
    state = RetryState(timeout=3, max_retries=10, backoff=1.0, uniform=lambda a, b: b)
    assert [state.nominal_backoff(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, hc.BACKOFF_CAP, hc.BACKOFF_CAP]


def test_retry_after_is_honoured_and_capped():
    script = Script(error(429, headers={"retry-after": "2"}), error(503, headers={"retry-after": "60"}),
                    httpx.Response(200, json=OCR_BODY))
    client, sleeps = make(script, total_timeout=300)
    assert client.ocr(b"img").id == "ocr-1"
    # honoured, then a little past it at random (at most 0.1 + 20%, 1 s), so that clients turned away at
    # once do not all come back at once
    assert 2.0 <= sleeps[0] <= 2.5 and hc.RETRY_AFTER_CAP <= sleeps[1] <= hc.RETRY_AFTER_CAP + 1.0
    assert len(sleeps) == 2


def test_retry_after_past_the_deadline_raises_at_once():
    script = Script(error(503, "draining", headers={"retry-after": "30"}))
    client, sleeps = make(script)  # default deadline: 3 x 3 s + backoffs, under 30 s
    with pytest.raises(hc.ServiceUnavailable) as info:
        client.ocr(b"img")
    assert info.value.retry_after == 30 and info.value.attempts == 1 and sleeps == []


def test_read_timeouts_are_retried_and_become_timeout():
    script = Script(httpx.ReadTimeout("slow"))
    client, sleeps = make(script)
    with pytest.raises(hc.Timeout) as info:
        client.ocr(b"img")
    assert info.value.attempts == 3 and len(script.requests) == 3 and len(sleeps) == 2
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)


@pytest.mark.parametrize(
    ("failure", "exc", "attempts"),
    [(httpx.ConnectTimeout("t"), hc.ConnectionFailed, 3),
     (httpx.RemoteProtocolError("closed"), hc.ConnectionFailed, 3),
     (httpx.ReadError("reset"), hc.ConnectionFailed, 3), (httpx.WriteTimeout("t"), hc.Timeout, 3),
     (httpx.LocalProtocolError("bad header"), hc.ConnectionFailed, 1),
     (httpx.UnsupportedProtocol("ftp"), hc.ConnectionFailed, 1)],
)
def test_transport_failures(failure, exc, attempts):
    script = Script(failure)
    client, _ = make(script)
    with pytest.raises(exc) as info:
        client.ocr(b"img")
    assert info.value.attempts == attempts == len(script.requests)
    assert info.value.__cause__ is failure


def test_max_retries_zero_means_one_attempt():
    script = Script(error(503))
    client, sleeps = make(script, max_retries=0)
    with pytest.raises(hc.ServiceUnavailable):
        client.ocr(b"img")
    assert len(script.requests) == 1 and sleeps == []


def test_non_json_error_bodies_still_map_to_the_right_class():
    html = httpx.Response(502, text="<html>Bad Gateway</html>", headers={"content-type": "text/html"})
    client, _ = make(Script(html))
    with pytest.raises(hc.ServiceUnavailable) as info:
        client.ocr(b"img")
    assert info.value.message == "HTTP 502 Bad Gateway" and info.value.type is None
    client, _ = make(Script(httpx.Response(404, text="not here")))
    with pytest.raises(hc.NotFound):
        client.models()
    client, _ = make(Script(httpx.Response(200, text="<html>login</html>")))
    with pytest.raises(hc.APIError, match="not JSON"):
        client.ocr(b"img")


def test_gateway_errors_from_a_proxy_are_retried():
    for status in (502, 504):
        script = Script(httpx.Response(status, text="<html>upstream timed out</html>"))
        client, sleeps = make(script)
        with pytest.raises(hc.ServiceUnavailable) as info:
            client.ocr(b"img")
        assert info.value.attempts == 3 == len(script.requests) and len(sleeps) == 2


def test_headers_request_ids_and_base_url():
    script = Script(error(503), httpx.Response(200, json=OCR_BODY))
    client, _ = make(script, api_key="sk-test")
    assert client.base_url == "http://hyocr.test"
    client.ocr(b"img")
    first, second = script.requests
    assert first.headers["authorization"] == "Bearer sk-test"
    base, _, n = first.headers["x-request-id"].partition(".")
    assert n == "1" and second.headers["x-request-id"] == f"{base}.2"  # one call id, per-attempt suffix
    assert HyocrClient("http://h:1/v1/").base_url == "http://h:1"


def test_request_shapes():
    script = Script(httpx.Response(200, json=OCR_BODY))
    client, _ = make(script)
    client.ocr(b"\x89PNG", task="extract", fields=["name", "id"], max_tokens=64)
    multipart = script.requests[-1]
    assert multipart.headers["content-type"].startswith("multipart/form-data")
    content = multipart.read()
    assert b'name="fields"\r\n\r\nname,id' in content and b'name="file"; filename="image"' in content
    client.ocr("data:image/png;base64,AAAA", task="text")
    assert json.loads(script.requests[-1].content) == {"image": "data:image/png;base64,AAAA", "task": "text"}
    client.ocr_many([b"ab", "data:image/png;base64,AAAA"], fields="a, b")
    body = json.loads(script.requests[-1].content)
    assert body == {"images": ["YWI=", "data:image/png;base64,AAAA"], "task": "spotting",
                    "fields": ["a", "b"], "stream": True}  # several pages: read as the page stream
    client.ocr(b"%PDF-1.7\n...")  # a document too (answered whole here: read whole)
    assert b'name="stream"\r\n\r\ntrue' in script.requests[-1].read()
    with pytest.raises(TypeError, match="feilds"):
        client.ocr(b"x", feilds=["a"])  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        client.ocr_many(b"one image, not a list")
    with pytest.raises(ValueError):
        client.chat([{"role": "user", "content": "hi"}], stream=True)


def test_probes_make_one_attempt_and_never_raise():
    client, sleeps = make(Script(httpx.Response(503, json={"status": "unavailable"})))
    assert client.ready() is False
    script = Script(httpx.ConnectError("refused"))
    client, sleeps = make(script)
    assert client.health() is False and len(script.requests) == 1 and sleeps == []
    client, _ = make(Script(httpx.Response(200, json={"status": "ok"})))
    assert client.health() is True


async def test_async_client_makes_the_same_decisions():
    script = Script(error(429, headers={"retry-after": "1.5"}), httpx.ReadTimeout("slow"),
                    httpx.Response(200, json=OCR_BODY))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    transport = httpx.MockTransport(script)
    async with AsyncHyocrClient("http://hyocr.test", transport=transport, sleep=sleep) as client:
        assert (await client.ocr(b"img")).text == "HELLO"
        assert 1.5 <= sleeps[0] <= 1.5 + 0.4 and len(sleeps) == 2 and len(script.requests) == 3
        script.answers = [error(500)]
        with pytest.raises(hc.ServerError) as info:
            await client.ocr(b"img")
        assert info.value.attempts == 1 and len(script.requests) == 4


def sse(*events: dict | str) -> httpx.Response:
    """A /v1/ocr page stream of ``events`` (dicts as data lines; "[DONE]" as it is)."""
    text = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream",
                                                                "x-request-id": "rid-s"})


PAGE = {"object": "ocr.page", "page": OCR_BODY["pages"][0], "completed": 1, "total": 2}
STOPPING = {"error": {"message": "the server is shutting down", "type": "service_unavailable",
                      "param": None, "code": "shutting_down"}}
PDF = b"%PDF-1.7\n..."


@pytest.mark.parametrize("cut", [STOPPING, None])
def test_a_document_stream_that_fails_before_a_page_was_handed_over_is_tried_again(cut):
    # A rolling deploy's 503 came as an error event, or the stream ended before its result: an image's call
    # retried it, a document's (streamed) raised it at once as a plain APIError
    first = sse(PAGE, cut, "[DONE]") if cut else sse(PAGE)
    script = Script(first, sse(PAGE, {**OCR_BODY}, "[DONE]"))
    client, sleeps = make(script)
    assert client.ocr(PDF).text == "HELLO" and len(script.requests) == 2 and len(sleeps) == 1
    if cut:
        assert sleeps[0] >= 1.0  # the 503's wait, as a 503 answered before the stream would have said


def test_a_stream_that_fails_after_a_page_was_handed_over_raises_its_typed_error_once():
    script = Script(sse(PAGE, STOPPING, "[DONE]"), sse(PAGE, {**OCR_BODY}, "[DONE]"))
    client, _ = make(script)
    given = []
    with pytest.raises(hc.ServiceUnavailable) as info:
        client.ocr(PDF, on_page=lambda page, done, total: given.append(done))
    assert given == [1] and len(script.requests) == 1  # the page is not handed over twice
    assert (info.value.code, info.value.request_id) == ("shutting_down", "rid-s")
    deadline = sse({"error": {"message": "past the deadline", "type": "timeout_error", "code": None}}, "[DONE]")
    client, _ = make(Script(deadline))
    with pytest.raises(hc.ServiceUnavailable) as info:  # hyocr's own 504: it would pass again
        client.ocr(PDF)
    assert info.value.status == 504 and info.value.attempts == 1


async def test_the_async_client_tries_a_failed_document_stream_again_too():
    script = Script(sse(PAGE, STOPPING, "[DONE]"), sse(PAGE, {**OCR_BODY}, "[DONE]"))
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    async with AsyncHyocrClient("http://hyocr.test", transport=httpx.MockTransport(script), sleep=sleep) as client:
        assert (await client.ocr(PDF)).text == "HELLO"
    assert len(script.requests) == 2 and len(sleeps) == 1


def test_a_total_timeout_bounds_a_document_read_page_by_page():
    state = RetryState(timeout=3.0, max_retries=2, backoff=0.1, total_timeout=5.0)
    default = RetryState(timeout=3.0, max_retries=2, backoff=0.1)
    import time

    before = default.deadline
    time.sleep(0.01)
    assert default.progressed() > before  # a page came: the default's room moves with it
    fixed = state.deadline
    assert state.progressed() == fixed  # the caller's bound stays


def test_timeouts_are_finite_numbers_of_seconds_above_zero():
    """0 silently meant the default, a negative was httpx's "Timeout value out of range", NaN passed the
    constructor and failed at the call, infinity an OverflowError."""
    import math

    import pytest

    from hyocr.client import HyocrClient

    for bad in (0, -1, math.nan, math.inf, "3", True):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds above 0"):
            HyocrClient(timeout=bad)
        with pytest.raises(ValueError, match="total_timeout must be"):
            HyocrClient(total_timeout=bad)
    with HyocrClient("http://127.0.0.1:9") as client:
        with pytest.raises(ValueError, match="timeout must be"):
            client.ocr(b"x", timeout=0)
