"""Typed views of /v1/ocr's answer (``OcrResult``, ``Page``, ``Block``), and its server-sent events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from .errors import APIError, ConnectionFailed

if TYPE_CHECKING:
    from .retry import RetryState


@dataclass(frozen=True, slots=True)
class Block:
    text: str
    box: tuple[float, ...] | None  # x1, y1, x2, y2 in pixels of the uploaded image
    score: float | None = None
    polygon: tuple[tuple[float, ...], ...] | None = None


@dataclass(frozen=True, slots=True)
class Page:
    index: int
    width: int
    height: int
    text: str
    blocks: list[Block]
    finish_reason: str  # stop | length | repetition | error
    markdown: str | None = None
    fields: dict[str, Any] | None = None
    error: str | None = None
    dpi: int | None = None  # PDF pages: the resolution it was read at
    source: str | None = None  # PDF pages: "render" (OCR) | "text_layer" (the PDF's own text)

    @classmethod
    def from_json(cls, p: dict[str, Any]) -> Page:
        def block(b: dict[str, Any]) -> Block:
            polygon = tuple(tuple(pt) for pt in b["polygon"]) if b.get("polygon") else None
            return Block(b["text"], tuple(b["box"]) if b.get("box") else None, b.get("score"), polygon)
        return cls(p["index"], p["width"], p["height"], p["text"], [block(b) for b in p["blocks"]],
                   p["finish_reason"], p.get("markdown"), p.get("fields"), p.get("error"), p.get("dpi"),
                   p.get("source"))


@dataclass(frozen=True, slots=True)
class OcrResult:
    """A typed view of the /v1/ocr response; ``raw`` is the JSON as received."""

    id: str
    model: str
    engine: str
    task: str
    requested_task: str
    text: str
    pages: list[Page]
    usage: dict[str, int]
    timings: dict[str, float]
    raw: dict[str, Any] = field(repr=False, compare=False)
    markdown: str | None = None  # document parsing: the pages' markdown joined

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> OcrResult:
        pages = [Page.from_json(p) for p in body["pages"]]
        return cls(body["id"], body["model"], body["engine"], body["task"], body["requested_task"],
                   body["text"], pages, dict(body.get("usage", {})), dict(body.get("timings", {})), body,
                   body.get("markdown"))


_EVENT_STATUS = {"timeout_error": 504, "service_unavailable": 503, "invalid_request_error": 400}


class StreamedError(Exception):
    """An error event: the answer the server would have given before the stream began (a 503 when it stops
    for a deploy, a 504 past the deadline), made a response so that the retry decision is the same."""

    def __init__(self, detail: dict) -> None:
        super().__init__(detail.get("message", "error"))
        self.detail = detail

    def as_response(self, stream: httpx.Response) -> httpx.Response:
        status = _EVENT_STATUS.get(self.detail.get("type"), 500)
        headers = {"x-request-id": stream.headers.get("x-request-id", "")}
        if status == 503:  # the server's 503s say when to come back; an event has no header: its default
            headers["retry-after"] = "1"
        return httpx.Response(status, json={"error": self.detail}, headers=headers, request=stream.request)


class StreamEnded(httpx.RemoteProtocolError):
    """The stream ended before its result: a connection failure (tried again when no page was handed over)."""

    def __init__(self) -> None:
        super().__init__("the event stream ended before the result")


class Delivered:
    """``on_page`` counting the pages it was given: once one was, a cut stream is not tried again (the
    retry would give them again)."""

    def __init__(self, on_page: Callable[[Page, int, int], None] | None) -> None:
        self.on_page, self.count = on_page, 0

    def __call__(self, page: Page, completed: int, total: int) -> None:
        if self.on_page is not None:  # a stream read for its timeout alone gave no one anything: tried again
            self.count += 1
            self.on_page(page, completed, total)


def is_event_stream(response: httpx.Response) -> bool:
    """A successful answer in server-sent events (a server that answered a stream request whole, a proxy's
    rewrite, a test's transport: read as the whole body it is)."""
    return response.is_success and response.headers.get("content-type", "").startswith("text/event-stream")


def stream_cut(exc: Exception, pages: int, request_id: str) -> ConnectionFailed:
    return ConnectionFailed(f"the event stream was cut after {pages} page(s) ({type(exc).__name__}); not tried "
                            "again, which would read and hand over those pages twice", request_id=request_id)


def within(chunks: Iterable[Any], deadline: float, response: httpx.Response, *, idle: float | None = None,
           state: RetryState | None = None) -> Iterator[Any]:
    """``chunks`` until ``deadline`` (time.monotonic): past it, httpx's ReadTimeout, as a silent server gets.
    ``idle``: the deadline moves that far past each chunk (a page stream: a long document goes on while its
    pages come; what is bounded is the wait for the next one), never past the call's (``state``)."""
    for chunk in chunks:
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("no whole answer within the attempt's timeout", request=response.request)
        if idle is not None and not keepalive(chunk):
            deadline = time.monotonic() + idle
            if state is not None:
                deadline = min(deadline, state.progressed())
        yield chunk


async def paced(lines: AsyncIterator[str], limit: Any, idle: float, state: RetryState) -> AsyncIterator[str]:
    """``lines``, the ``asyncio.timeout`` ``limit`` moved ``idle`` seconds past each (as ``within``'s idle),
    never past the call's deadline (on time.monotonic; the limit is on the loop's clock)."""
    import asyncio

    async for line in lines:
        if not keepalive(line):
            left = min(idle, state.progressed() - time.monotonic())
            limit.reschedule(asyncio.get_running_loop().time() + left)
        yield line


def keepalive(line: Any) -> bool:
    """An SSE comment (``: ping``, a proxy's heartbeat) or the blank line ending an event: no progress, so it does
    not move the wait for the next page (a heartbeat every few seconds kept a dead read waiting for ever)."""
    return isinstance(line, str) and (not line.strip() or line.startswith(":"))


def whole(raw: Iterable[bytes], response: httpx.Response) -> httpx.Response:
    """The response with its body read (raw, so that its content encoding is undone once)."""
    if response.is_stream_consumed:  # already read (a transport that answers whole responses, a mock's)
        return response
    return httpx.Response(response.status_code, headers=response.headers, content=b"".join(raw),
                          request=response.request)


def read_events(lines: Iterable[str], on_page: Callable[[Page, int, int], None]) -> OcrResult:
    """/v1/ocr's server-sent events: ``on_page`` per page event; the result event is returned."""
    for line in lines:
        if (result := _event(line, on_page)) is not None:
            return result
    raise StreamEnded


async def read_events_async(lines: AsyncIterator[str], on_page: Callable[[Page, int, int], None]) -> OcrResult:
    async for line in lines:
        if (result := _event(line, on_page)) is not None:
            return result
    raise StreamEnded


def _event(line: str, on_page: Callable[[Page, int, int], None]) -> OcrResult | None:
    try:
        return _parsed_event(line, on_page)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not hyocr's events: a proxy, a cut line
        raise APIError(502, f"the server's event stream is malformed ({type(exc).__name__})") from None


def _parsed_event(line: str, on_page: Callable[[Page, int, int], None]) -> OcrResult | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    event = json.loads(line[6:])
    if "error" in event:  # a failure after the stream had started
        raise StreamedError(dict(event["error"]))
    if event.get("object") == "ocr.page":
        on_page(Page.from_json(event["page"]), event["completed"], event["total"])
    elif event.get("object") == "ocr.result":
        return OcrResult.from_json(event)
    return None
