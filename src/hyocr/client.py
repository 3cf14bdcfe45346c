"""Python client for a hyocr server: ``HyocrClient`` (blocking) and ``AsyncHyocrClient`` (asyncio).

    with HyocrClient("http://127.0.0.1:8000") as client:
        print([(b.text, b.box) for b in client.ocr("card.png").pages[0].blocks])  # lines, pixel boxes

Retries (the reference article promises "a 3 s timeout and at most 2 retries"): ``timeout`` bounds each
attempt, ``total_timeout`` a whole call (by default, room for every attempt at its full timeout plus the
backoffs, so it only bites on a long ``Retry-After``). Retried, at most ``max_retries`` times, after a
jittered exponential backoff or the server's ``Retry-After`` (capped at 10 s; one that ends past the
deadline is not waited for, the error is raised at once): connection failures (refused, connect timeout,
reset, a keep-alive connection the server had closed), 429, 503, 502/504 from a proxy, and read timeouts:
OCR and chat requests have no side effects, so a repeat is safe, and a stalled connection or a brief
overload may spare the next attempt. The price: the server finishes an attempt the client gave up on (it
does not cancel non-streaming work on disconnect), so a slow server gets up to ``max_retries + 1`` copies
(use ``max_retries=0`` with a saturated one). Never retried: 400/401/403/404/413/415/422 (it would fail the
same way), 500 (the engine failed on this input, maybe after expensive work) and hyocr's own 504 (its
request deadline passed, and would again). Each attempt sends ``X-Request-ID: <call id>.<attempt>``, so the
server's logs tie retries together; exceptions carry that id (``request_id``) and ``attempts``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypedDict, TypeGuard, Unpack

import httpx

from . import __version__

__all__ = [  # noqa: RUF022 (clients, results, then the exception tree)
    "HyocrClient", "AsyncHyocrClient", "OcrOptions", "OcrResult", "Page", "Block",
    "HyocrClientError", "Timeout", "ConnectionFailed", "APIError", "BadRequest", "AuthenticationError",
    "PermissionDenied", "NotFound", "RateLimited", "ServerError", "ServiceUnavailable"]

ImageInput = bytes | str | Path
RETRY_AFTER_CAP = 10.0  # seconds: the longest Retry-After honoured
BACKOFF_CAP = 4.0  # seconds: the longest backoff between attempts
_RETRY_STATUS = frozenset({429, 502, 503, 504})


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


class HyocrClientError(Exception):
    """Base of everything this client raises."""

    def __init__(self, message: str, *, request_id: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message, self.request_id, self.retryable = message, request_id, retryable
        self.attempts = 1  # requests sent for this call


class Timeout(HyocrClientError): """No answer within the timeout, on every attempt."""
class ConnectionFailed(HyocrClientError): """Unreachable, or the connection dropped before an answer."""


class APIError(HyocrClientError):
    """The server answered with an error: its ``{"error": {...}}`` body, status and ``X-Request-ID``."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, request_id: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, request_id=request_id, retryable=status in _RETRY_STATUS)
        self.status, self.type, self.param, self.code = status, type, param, code
        self.retry_after = retry_after  # seconds, from Retry-After

    def __str__(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("param", self.param), ("code", self.code)) if v)
        rid = f" (request id {self.request_id})" if (self.request_id or "") not in self.message else ""
        return f"HTTP {self.status}: {self.message}{extra}{rid}"


# One-liners by status (PEP 8: related one-liners may go without blank lines).
class BadRequest(APIError): """400/413/415/422: parameters, image, size or format; retrying won't help."""
class AuthenticationError(APIError): """401."""
class PermissionDenied(APIError): """403."""
class NotFound(APIError): """404."""
class RateLimited(APIError): """429 after the retries; ``retry_after``: when the server expects more."""
class ServerError(APIError): """500 and other 5xx: the server failed on this request."""
class ServiceUnavailable(APIError): """503 (not ready, overloaded, draining), 502/504 (a proxy, a deadline)"""


_ERROR_CLASSES: dict[int, type[APIError]] = {
    400: BadRequest, 413: BadRequest, 415: BadRequest, 422: BadRequest, 401: AuthenticationError,
    403: PermissionDenied, 404: NotFound, 429: RateLimited, 500: ServerError,
    502: ServiceUnavailable, 503: ServiceUnavailable, 504: ServiceUnavailable,
}


def error_from_response(response: httpx.Response) -> APIError:
    """The typed error for a non-2xx answer; a non-JSON body (a proxy's HTML page) gets a generic message."""
    status = response.status_code
    try:
        detail = response.json().get("error")
    except (ValueError, AttributeError):
        detail = None
    ours = isinstance(detail, dict)  # hyocr's own error body, not a proxy's page
    if not ours:
        detail = {"message": f"HTTP {status} {response.reason_phrase}".strip()}
    try:  # Retry-After in seconds (decimals tolerated); the HTTP-date form is ignored
        retry_after: float | None = max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        retry_after = None
    cls = _ERROR_CLASSES.get(status) or (ServerError if status >= 500 else APIError)
    error = cls(status, str(detail.get("message") or f"HTTP {status}"), type=detail.get("type"),
                param=detail.get("param"), code=detail.get("code"),
                request_id=response.headers.get("x-request-id"), retry_after=retry_after)
    error.retryable &= not (ours and status == 504)  # hyocr's own deadline passed: it would pass again
    return error


def error_from_transport(exc: httpx.TransportError, timeout: float, request_id: str) -> HyocrClientError:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return Timeout(f"no answer within {timeout:g} s", request_id=request_id, retryable=True)
    # A ConnectTimeout sent nothing: the server is unreachable. Not retried: LocalProtocolError,
    # UnsupportedProtocol, ProxyError (our request or setup is wrong).
    retryable = isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError | httpx.ConnectTimeout)
    return ConnectionFailed(f"{type(exc).__name__}: {exc}", request_id=request_id, retryable=retryable)


class RetryState:
    """One call's attempts and deadline, and the decision after each failure (no I/O: both clients)."""

    def __init__(self, timeout: float, max_retries: int, backoff: float, total_timeout: float | None = None,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self.timeout, self.max_retries, self.backoff, self.uniform = timeout, max_retries, backoff, uniform
        if total_timeout is None:
            backoffs = sum(self.nominal_backoff(n) for n in range(1, max_retries + 1))
            total_timeout = (max_retries + 1) * timeout + backoffs
        self.deadline = time.monotonic() + total_timeout
        self.attempt, self.call_id = 0, uuid.uuid4().hex

    def nominal_backoff(self, retry: int) -> float:
        return min(BACKOFF_CAP, self.backoff * 2 ** (retry - 1))

    def start(self) -> tuple[float, str]:
        """Begin an attempt: its timeout (never past the deadline) and its X-Request-ID."""
        self.attempt += 1
        remaining = max(self.deadline - time.monotonic(), 0.001)
        return min(self.timeout, remaining), f"{self.call_id}.{self.attempt}"

    def wait_before_retry(self, error: HyocrClientError) -> float | None:
        """Seconds to sleep before the next attempt, or None: give up and raise ``error``."""
        error.attempts = self.attempt
        if self.attempt > self.max_retries or not error.retryable:
            return None
        retry_after = getattr(error, "retry_after", None)
        remaining = self.deadline - time.monotonic()
        if retry_after is not None:  # when it ends past our deadline, sleeping on it is wasted time
            return min(retry_after, RETRY_AFTER_CAP) if retry_after < remaining else None
        wait = self.nominal_backoff(self.attempt) * self.uniform(0.5, 1.0)  # "equal jitter"
        return wait if wait < remaining else None


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


@dataclass(frozen=True, slots=True)
class Call:
    """One API call, whichever client sends it: the request, and how to read the answer."""

    method: str
    path: str
    kwargs: dict[str, Any]
    parse: Callable[[httpx.Response], Any]
    timeout: float | None = None  # per attempt; None: the client's
    probe: bool = False  # health/ready report the state now: one attempt, any failure reads as False
    on_page: Callable[[Page, int, int], None] | None = None  # set: the answer is /v1/ocr's event stream


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


def _is_data_url(image: ImageInput) -> TypeGuard[str]:
    return isinstance(image, str) and image.startswith("data:")


def _image_bytes(image: ImageInput) -> tuple[str, bytes]:
    """(filename, bytes) of an image given as bytes or as a file path (any str but a data URL)."""
    if isinstance(image, bytes | bytearray | memoryview):
        return "image", bytes(image)
    return Path(image).name, Path(image).read_bytes()


def ocr_call(images: Sequence[ImageInput], options: OcrOptions, *, many: bool = False) -> Call:
    """POST /v1/ocr: one image as a multipart upload (a data URL as JSON ``image``), several as JSON
    ``images`` in base64."""
    if many and (isinstance(images, bytes | str | Path) or not images):
        raise ValueError("ocr_many() takes a non-empty sequence of images")
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
    body = {"task": "spotting", **given}
    if many or _is_data_url(images[0]):
        pages = [i if _is_data_url(i) else base64.b64encode(_image_bytes(i)[1]).decode() for i in images]
        kwargs: dict[str, Any] = {"json": {"images": pages, **body} if many else {"image": pages[0], **body}}
    else:
        name, data = _image_bytes(images[0])
        form = {k: ",".join(v) if isinstance(v, list) else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in body.items()}
        kwargs = {"files": {"file": (name, data, "application/octet-stream")}, "data": form}
    return Call("POST", "/v1/ocr", kwargs, lambda r: OcrResult.from_json(r.json()), timeout, on_page=on_page)


def chat_call(messages: list[dict[str, Any]], timeout: float | None, body: dict[str, Any]) -> Call:
    if body.get("stream"):
        raise ValueError("chat() does not stream; use the openai client for stream=True")
    return Call("POST", "/v1/chat/completions", {"json": {**body, "messages": messages, "stream": False}},
                httpx.Response.json, timeout)


MODELS = Call("GET", "/v1/models", {}, lambda r: r.json()["data"])
HEALTH = Call("GET", "/health", {}, lambda r: r.status_code == 200, probe=True)
READY = Call("GET", "/ready", {}, lambda r: r.status_code == 200, probe=True)


class _Base:
    """Settings and the decision after each attempt; the subclasses only send and sleep."""

    _http_class: Callable[..., Any]  # httpx.Client or httpx.AsyncClient
    _default_sleep: Callable[[float], Any]

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: str | None = None,
                 timeout: float = 3.0, max_retries: int = 2, backoff: float = 0.25,
                 total_timeout: float | None = None, transport: Any = None, sleep: Any = None) -> None:
        """``transport`` (an httpx transport) and ``sleep`` let tests fake the network and the waits."""
        if timeout <= 0 or max_retries < 0 or backoff < 0:
            raise ValueError("timeout must be > 0, max_retries and backoff >= 0")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")  # an OpenAI-style base URL works too
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.total_timeout = total_timeout
        self.headers = {"User-Agent": f"hyocr-client/{__version__}"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._sleep = sleep or self._default_sleep
        self._http = self._http_class(base_url=self.base_url, headers=self.headers, transport=transport)

    def _retry_state(self, call: Call) -> RetryState:
        return RetryState(call.timeout or self.timeout, 0 if call.probe else self.max_retries,
                          self.backoff, None if call.timeout else self.total_timeout)

    @staticmethod
    def _settle(state: RetryState, call: Call, result: httpx.Response | httpx.TransportError,
                timeout: float, request_id: str) -> tuple[bool, Any]:
        """(True, value): return it. (False, seconds): sleep, then try again. Raises when giving up."""
        if isinstance(result, httpx.Response) and (result.is_success or call.probe):
            try:
                return True, call.parse(result)
            except ValueError:  # a proxy's page with a 200, say
                raise APIError(result.status_code, "the server's answer is not JSON",
                               request_id=result.headers.get("x-request-id")) from None
        error, cause = ((error_from_response(result), None) if isinstance(result, httpx.Response)
                        else (error_from_transport(result, timeout, request_id), result))
        wait = state.wait_before_retry(error)
        if wait is not None:
            return False, wait
        if call.probe:
            return True, False
        raise error from cause


class HyocrClient(_Base):
    """Blocking client (httpx.Client): close it, or use it as a context manager."""

    _http_class = httpx.Client
    _default_sleep = staticmethod(time.sleep)

    def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            try:
                if call.on_page is None:
                    result: Any = self._http.request(call.method, call.path, timeout=timeout,
                                                     headers={"X-Request-ID": request_id}, **call.kwargs)
                else:
                    with self._http.stream(call.method, call.path, timeout=timeout,
                                           headers={"X-Request-ID": request_id}, **call.kwargs) as result:
                        if result.is_success:
                            return read_events(result.iter_lines(), call.on_page)
                        result.read()
            except httpx.TransportError as exc:
                result = exc
            done, value = self._settle(state, call, result, timeout, request_id)
            if done:
                return value
            self._sleep(value)

    def ocr(self, image: ImageInput, **options: Unpack[OcrOptions]) -> OcrResult:
        """Read one image or PDF: bytes, a path (str or Path), or a ``data:`` URL."""
        return self._run(ocr_call([image], options))

    def ocr_many(self, images: Sequence[ImageInput], **options: Unpack[OcrOptions]) -> OcrResult:
        """Read several images as the pages of one request: one result, ``pages`` in order."""
        return self._run(ocr_call(images, options, many=True))

    def chat(self, messages: list[dict], *, timeout: float | None = None, **body: Any) -> dict:
        """POST /v1/chat/completions, not streaming; ``body``: the rest of the OpenAI request."""
        return self._run(chat_call(messages, timeout, body))

    # Related one-liners. health: the process answers; ready: the engine is loaded and answering. Both
    # report the state now: one attempt, False on any failure (503, unreachable).
    def health(self) -> bool: return self._run(HEALTH)
    def ready(self) -> bool: return self._run(READY)
    def models(self) -> list[dict[str, Any]]: return self._run(MODELS)
    def close(self) -> None: self._http.close()
    def __enter__(self) -> Self: return self
    def __exit__(self, *exc: object) -> None: self.close()


class AsyncHyocrClient(_Base):
    """``HyocrClient`` on asyncio (httpx.AsyncClient): the same methods, as coroutines."""

    _http_class = httpx.AsyncClient
    _default_sleep = staticmethod(asyncio.sleep)

    async def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            try:
                if call.on_page is None:
                    result: Any = await self._http.request(call.method, call.path, timeout=timeout,
                                                           headers={"X-Request-ID": request_id}, **call.kwargs)
                else:
                    async with self._http.stream(call.method, call.path, timeout=timeout,
                                                 headers={"X-Request-ID": request_id}, **call.kwargs) as result:
                        if result.is_success:
                            return await read_events_async(result.aiter_lines(), call.on_page)
                        await result.aread()
            except httpx.TransportError as exc:
                result = exc
            done, value = self._settle(state, call, result, timeout, request_id)
            if done:
                return value
            await self._sleep(value)

    async def ocr(self, image: ImageInput, **options: Unpack[OcrOptions]) -> OcrResult:
        return await self._run(ocr_call([image], options))

    async def ocr_many(self, images: Sequence[ImageInput], **options: Unpack[OcrOptions]) -> OcrResult:
        return await self._run(ocr_call(images, options, many=True))

    async def chat(self, messages: list[dict], *, timeout: float | None = None, **body: Any) -> dict:
        return await self._run(chat_call(messages, timeout, body))

    async def health(self) -> bool: return await self._run(HEALTH)
    async def ready(self) -> bool: return await self._run(READY)
    async def models(self) -> list[dict[str, Any]]: return await self._run(MODELS)
    async def aclose(self) -> None: await self._http.aclose()
    async def __aenter__(self) -> Self: return self
    async def __aexit__(self, *exc: object) -> None: await self.aclose()
