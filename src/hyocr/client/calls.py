"""What each API call sends and how its answer is read (``Call``), whichever client sends it."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeGuard

import httpx

from .results import OcrResult, Page

ImageInput = bytes | str | Path


class OcrOptions(TypedDict, total=False):
    """Keyword arguments of ``ocr`` and ``ocr_many`` (None or absent: the server's default)."""

    task: str  # spotting (default), text, document, extract, translate, vqa, formula, table, chart, ...
    fields: Sequence[str] | str | None  # task="extract": names, or one comma-separated string
    language: str | None  # task="translate": en | zh
    question: str | None  # task="vqa"
    max_tokens: int | None
    model: str | None  # a LoRA adapter name
    pages: str | None  # a PDF's pages to read, 1-based: "2-5,8" (default all)
    prefer_text_layer: bool | None  # task="text": a PDF page's own text when it is reliable
    timeout: float | None  # per attempt, this call only
    # Called as each page finishes (page, pages done, pages in all): the request streams (stream=true).
    on_page: Callable[[Page, int, int], None] | None


@dataclass(frozen=True, slots=True)
class Call:
    """One API call, whichever client sends it: the request, and how to read the answer."""

    method: str
    path: str
    kwargs: dict[str, Any]
    parse: Callable[[httpx.Response], Any]
    timeout: float | None = None  # per attempt; None: the client's
    probe: bool = False  # health/ready report the state now: one attempt, any failure reads as False
    on_page: Callable[[Page, int, int], None] | None = None  # called with each page of the event stream
    headers: dict[str, str] | None = None  # sent with every attempt (beside X-Request-ID)
    # The answer is /v1/ocr's event stream (on_page set, or a document): the timeout bounds each page's wait
    stream: bool = False


def _is_data_url(image: ImageInput) -> TypeGuard[str]:
    return isinstance(image, str) and image.startswith("data:")


def _image_bytes(image: ImageInput) -> tuple[str, bytes]:
    """(filename, bytes) of an image given as bytes or as a file path (any str but a data URL)."""
    if isinstance(image, bytes | bytearray | memoryview):
        return "image", bytes(image)
    return Path(image).name, Path(image).read_bytes()


def ocr_body(options: OcrOptions) -> tuple[dict[str, Any], float | None, Callable | None]:
    """/v1/ocr's options as its body (task defaulted, fields a list), and the call's timeout and on_page."""
    given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
    if unknown := set(given) - set(OcrOptions.__annotations__):
        raise TypeError(f"unexpected option(s): {', '.join(sorted(unknown))}")
    timeout = given.pop("timeout", None)
    on_page = given.pop("on_page", None)
    if on_page is not None:
        given["stream"] = True
    if isinstance(given.get("fields"), str):
        given["fields"] = given["fields"].split(",")
    if "fields" in given:
        given["fields"] = [f.strip() for f in given["fields"] if f.strip()]
    return {"task": "spotting", **given}, timeout, on_page


def json_images(images: Sequence[ImageInput]) -> list[str]:
    """Images for a JSON body: data URLs as they are, the rest in base64."""
    return [i if _is_data_url(i) else base64.b64encode(_image_bytes(i)[1]).decode() for i in images]


def media_body(images: Sequence[ImageInput], body: dict[str, Any], *, many: bool) -> dict[str, Any]:
    """The request's body (httpx keywords) for /v1/ocr and /v1/jobs. Images given as bytes or paths go as a
    multipart upload (``file``, or ``files`` for several, in order), sent from their bytes as they are:
    base64 in JSON would be a third larger and copied twice more on the way. Where a data URL is among them
    (text already), all go as JSON (``image``, or ``images``), the rest in base64."""
    if any(_is_data_url(i) for i in images):
        pages = json_images(images)
        return {"json": {"images": pages, **body} if many else {"image": pages[0], **body}}
    field = "files" if many else "file"
    files = [(field, (name, data, "application/octet-stream")) for name, data in map(_image_bytes, images)]
    return {"files": files, "data": {k: _form_value(v) for k, v in body.items()}}


def _form_value(value: Any) -> str:
    """An option as the server's form reads it: lists comma-separated, true/false, objects as JSON text."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return ",".join(value)
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def ocr_call(images: Sequence[ImageInput], options: OcrOptions, *, many: bool = False) -> Call:
    """POST /v1/ocr: the images as ``media_body`` sends them (a multipart upload, or JSON for data URLs).
    A document (a PDF, a multi-page TIFF, several images) is read as the page stream whether or not the
    caller takes its pages: the timeout then bounds each page, not the whole document, which at the
    default 3 s a PDF of a few pages would pass and be read again by every retry."""
    if many and (isinstance(images, bytes | str | Path) or not images):
        raise ValueError("ocr_many() takes a non-empty sequence of images")
    body, timeout, on_page = ocr_body(options)
    stream = on_page is not None or many or any(map(_is_document, images))
    if stream:
        body["stream"] = True
    return Call("POST", "/v1/ocr", media_body(images, body, many=many),
                lambda r: OcrResult.from_json(r.json()), timeout, on_page=on_page, stream=stream)


def _is_document(image: ImageInput) -> bool:
    """A PDF or a multi-page TIFF, by its bytes (a data URL by its media type)."""
    if _is_data_url(image):
        return image[5:].lower().startswith(("application/pdf", "image/tiff"))
    from ..pipeline.media import is_document

    if isinstance(image, bytes | bytearray | memoryview):
        return is_document(bytes(image))
    with open(image, "rb") as file:  # a path: its first bytes tell, but a TIFF's page count needs all of it
        head = file.read(1024)
        return is_document(head + file.read() if head[:4] in (b"II*\0", b"MM\0*") else head)


def chat_call(messages: list[dict[str, Any]], timeout: float | None, body: dict[str, Any]) -> Call:
    if body.get("stream"):
        raise ValueError("chat() does not stream; use the openai client for stream=True")
    return Call("POST", "/v1/chat/completions", {"json": {**body, "messages": messages, "stream": False}},
                httpx.Response.json, timeout)


MODELS = Call("GET", "/v1/models", {}, lambda r: r.json()["data"])
HEALTH = Call("GET", "/health", {}, lambda r: r.status_code == 200, probe=True)
READY = Call("GET", "/ready", {}, lambda r: r.status_code == 200, probe=True)
