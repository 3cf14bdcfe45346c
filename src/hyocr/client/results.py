"""Typed views of /v1/ocr's answer (``OcrResult``, ``Page``, ``Block``), and its server-sent events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import APIError, ConnectionFailed


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


_EVENT_STATUS = {"timeout_error": 504, "service_unavailable": 503}


def read_events(lines: Iterable[str], on_page: Callable[[Page, int, int], None]) -> OcrResult:
    """/v1/ocr's server-sent events: ``on_page`` per page event; the result event is returned."""
    for line in lines:
        if (result := _event(line, on_page)) is not None:
            return result
    raise ConnectionFailed("the event stream ended before the result")


async def read_events_async(lines: AsyncIterator[str], on_page: Callable[[Page, int, int], None]) -> OcrResult:
    async for line in lines:
        if (result := _event(line, on_page)) is not None:
            return result
    raise ConnectionFailed("the event stream ended before the result")


def _event(line: str, on_page: Callable[[Page, int, int], None]) -> OcrResult | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    event = json.loads(line[6:])
    if "error" in event:  # a failure after the stream had started
        detail = event["error"]
        raise APIError(_EVENT_STATUS.get(detail.get("type"), 500), detail.get("message", "error"),
                       type=detail.get("type"), code=detail.get("code"))
    if event.get("object") == "ocr.page":
        on_page(Page.from_json(event["page"]), event["completed"], event["total"])
    elif event.get("object") == "ocr.result":
        return OcrResult.from_json(event)
    return None
