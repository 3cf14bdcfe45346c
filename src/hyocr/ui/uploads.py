"""The UI's file uploads under the API's rules: a pure ASGI guard in front of the mounted Gradio app.

Gradio's ``POST /ui/gradio_api/upload`` stores whatever it is sent (one file per content hash and name,
readable again at ``/ui/gradio_api/file=...``), checking only ``max_file_size`` per file. In front of it,
``UploadGuard`` parses the same multipart stream as it arrives, before Gradio sees each chunk, and refuses
with the API's JSON errors:

- size: ``Content-Length`` over what an upload may be (413 before any byte is read), then each file's size,
  format and the body's shape as it streams (ui/multipart.py: the rules, as the API's);
- space: the bytes the UI keeps (uploads and the files its results are served from) stay under
  ``UI_UPLOAD_CACHE_BYTES``; an upload that would pass it first evicts the least recently used files (an
  upload larger than the whole cache: 413; room held by uploads still arriving: 503).

A refusal mid-body reaches Gradio as a multipart parse error, the one failure on which its parser deletes
the temporary files it has begun (a client that hangs up or a body cap hit upstream is passed on the same
way, then re-raised for the outer middleware to answer as for the API). Who may upload (401/403) and how
often (429) are settled before this, by the app's auth and rate-limit middleware, as for every route.

Gradio's ``process_recording`` route (screen recordings; this UI has none) keeps every body it is sent in
the temporary folder, its ``file=<http URL>`` fetches any public URL for the caller (an open proxy, where the
UI promises to contact nothing outside the server) and ``proxy=`` serves Spaces' proxies: all answer 404 here.
Gradio's own errors (``{"detail": ...}``) leave in the API's error shape (``_ApiErrors``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api.errors import error_headers, hyocr_error_body
from ..errors import HyocrError, InvalidRequest, NotFound, PayloadTooLarge, ServiceUnavailable
from .multipart import MultipartInspector, UploadRefused, UploadRules

__all__ = ["UploadCache", "UploadGuard", "UploadRefused", "UploadRules", "remove_file"]

log = logging.getLogger("hyocr.ui")

UPLOAD_PATH = "/gradio_api/upload"  # relative to the mount
REFUSED_PATHS = frozenset({"/gradio_api/process_recording"})
_URL = re.compile(r"(?:[a-z][a-z0-9+.-]*:|[/\\]{2})", re.IGNORECASE)  # a scheme, or a scheme-relative URL


def _refused(path: str) -> bool:
    for prefix in ("/gradio_api/file=", "/file=", "/gradio_api/file/", "/file/"):  # the last two: Gradio's
        if path.startswith(prefix):  # deprecated spelling of the same route
            return _URL.match(path[len(prefix):]) is not None
    return path in REFUSED_PATHS or path.startswith(("/gradio_api/proxy=", "/proxy="))


class UploadCache:
    """The bytes the UI keeps on disk: the files Gradio tracks for this app (uploads, and the files results
    are served from), less the ones it keeps for good (the examples). Room for an upload is reserved before
    its body is read; what does not fit evicts the least recently used files (ctime: the UI touches an
    upload each time it reads it, and Gradio's own expiry goes by ctime too)."""

    def __init__(self, blocks: Any, max_bytes: int) -> None:
        self.blocks = blocks
        self.max_bytes = max_bytes
        self.reserved = 0  # room held for uploads still arriving
        self._lock = asyncio.Lock()

    def _sets(self) -> list[set[str]]:
        return list(getattr(self.blocks, "temp_file_sets", None) or [self.blocks.upload_file_set])

    def _kept(self) -> set[str]:
        kept: set[str] = set()
        for block in list(self.blocks.blocks.values()):
            kept |= getattr(block, "keep_in_cache", set())
        return kept

    def files(self) -> list[tuple[float, int, str]]:
        """(ctime, bytes, path) of every file the cache counts."""
        kept = self._kept()
        out, seen = [], set()
        for tracked in self._sets():
            for path in list(tracked):
                if path in kept or path in seen:
                    continue
                seen.add(path)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append((st.st_ctime, st.st_size, path))
        return out

    def used(self) -> int:
        return sum(size for _, size, _ in self.files())

    async def reserve(self, nbytes: int) -> None:
        if nbytes > self.max_bytes:
            raise PayloadTooLarge(f"the upload is larger than the web UI's {self.max_bytes} byte upload space",
                                  code="ui_upload_cache_too_small")
        async with self._lock:
            if self.reserved + nbytes > self.max_bytes:
                raise ServiceUnavailable("the web UI's upload space is taken by uploads still arriving; retry "
                                         "in a moment", code="ui_upload_cache_full")
            await asyncio.to_thread(self._make_room, self.reserved + nbytes)
            self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        self.reserved -= nbytes

    def _make_room(self, wanted: int) -> None:
        files = sorted(self.files())
        used = sum(size for _, size, _ in files)
        evicted = freed = 0
        for _, size, path in files:
            if used + wanted <= self.max_bytes:
                break
            self.forget(path)
            used -= size
            evicted, freed = evicted + 1, freed + size
        if evicted:
            log.info("web UI upload space: %d least recently used files (%d bytes) removed for an upload",
                     evicted, freed)

    def forget(self, path: str) -> None:
        """Delete one file the cache counts, and its folder when that is left empty."""
        for tracked in self._sets():
            tracked.discard(path)
        remove_file(path)


def remove_file(path: str | Path) -> None:
    """Delete a file of Gradio's cache and the content-hash folder it sat in, if now empty."""
    path = Path(path)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass


@dataclass
class _Upload:
    refusal: HyocrError | None = None
    upstream: BaseException | None = None  # from the server or an outer middleware: re-raised
    done: bool = False
    seen: int = 0


class UploadGuard:
    """ASGI: wraps the mounted Gradio app; upload requests pass through the rules and the cache."""

    def __init__(self, app: ASGIApp, rules: UploadRules, cache: UploadCache) -> None:
        self.app = app
        self.rules = rules
        self.cache = cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        if _refused(path):
            await _send_error(scope, send, NotFound("not found", code="not_found"))
            return
        if path != UPLOAD_PATH or scope["method"] != "POST":
            await self.app(scope, receive, _ApiErrors(scope, send))
            return
        try:
            inspector, declared = self._start(scope)
            reservation = declared if declared is not None else self.rules.max_request_bytes
            await self.cache.reserve(reservation)
        except HyocrError as exc:
            await _send_error(scope, send, exc, close=True)
            return
        try:
            await self._forward(scope, receive, send, inspector, declared)
        finally:
            self.cache.release(reservation)

    def _start(self, scope: Scope) -> tuple[MultipartInspector, int | None]:
        headers = dict(scope["headers"])
        kind, params = parse_options_header(headers.get(b"content-type", b""))
        if kind != b"multipart/form-data" or not params.get(b"boundary"):
            raise InvalidRequest("uploads are multipart/form-data with a boundary")
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidRequest("invalid Content-Length header")
            if int(declared) > self.rules.max_request_bytes:
                raise PayloadTooLarge(f"the upload is larger than the {self.rules.max_request_bytes} byte limit")
        charset = params.get(b"charset", b"utf-8").decode("latin-1")
        try:
            "".encode(charset)
        except LookupError:
            raise InvalidRequest("unknown charset in Content-Type") from None
        return MultipartInspector(params[b"boundary"], charset, self.rules), int(declared) if declared else None

    async def _forward(self, scope: Scope, receive: Receive, send: Send, inspector: MultipartInspector,
                       declared: int | None) -> None:
        upload = _Upload()
        limit = declared if declared is not None else self.rules.max_request_bytes

        def refuse(error: HyocrError | None, upstream: BaseException | None = None) -> UploadRefused:
            upload.refusal, upload.upstream = error, upstream
            return UploadRefused(error)

        async def guarded_receive() -> Message:
            if upload.done:  # the body is in; later receives wait for a disconnect
                return await receive()
            try:
                message = await receive()
            except Exception as exc:  # noqa: BLE001
                # a body cap or timeout upstream: Gradio cleans up, then it is re-raised for the outer layer
                raise refuse(None, exc) from None
            if message["type"] == "http.disconnect":
                raise refuse(None, ClientDisconnect())
            if message["type"] != "http.request":
                return message
            body = message.get("body", b"")
            upload.seen += len(body)
            if upload.seen > limit:
                raise refuse(PayloadTooLarge(f"the upload is larger than its {limit} byte length"
                                             if declared is not None else
                                             f"the upload is larger than the {limit} byte limit"))
            try:
                inspector.write(body)
                if not message.get("more_body", False):
                    inspector.finish()
                    upload.done = True
            except UploadRefused as exc:
                raise refuse(exc.error) from None
            return message

        async def guarded_send(message: Message) -> None:
            if upload.refusal is None and upload.upstream is None:
                await send(message)
            # else: Gradio's answer to the aborted parse (a plain-text 400) is replaced below

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if upload.refusal is None and upload.upstream is None:
                raise
            # Gradio let the abort through (its last-resort handler re-raises): answered below
        if upload.upstream is not None:
            raise upload.upstream
        if upload.refusal is not None:
            log.info("web UI upload refused: %s", upload.refusal.message)
            await _send_error(scope, send, upload.refusal, close=True)


def _route_path(scope: Scope) -> str:
    """The path inside the mount (Starlette keeps the full path and the mount in root_path)."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("/", ""):
        return path[len(root):]
    return path


async def _send_error(scope: Scope, send: Send, exc: HyocrError, *, close: bool = False) -> None:
    status, body = hyocr_error_body(exc, scope.get("state", {}).get("request_id") or "-")
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error_headers(exc).items()]
    if close:  # the rest of the body is not read: the connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class _ApiErrors:
    """An ASGI ``send`` that rewrites Gradio's JSON errors (FastAPI's ``{"detail": ...}``) into the API's
    shape; every other answer (pages, assets, event streams, files) passes as it is, unbuffered."""

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope, self.send = scope, send
        self.start: Message | None = None  # an error's start, held until its body is whole
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400 and any(
                k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in message["headers"]):
            self.start = message
            return
        if self.start is None or message["type"] != "http.response.body":
            await self.send(message)
            return
        self.body += message.get("body", b"")
        if message.get("more_body"):
            return
        status, start, self.start = self.start["status"], self.start, None
        try:
            detail = json.loads(self.body).get("detail")
        except (ValueError, AttributeError):
            detail = None
        if detail is None:  # not FastAPI's error form: as it was
            await self.send(start)
            await self.send({"type": "http.response.body", "body": self.body})
            return
        text = detail if isinstance(detail, str) else "the web UI could not take this request"
        data = json.dumps({"error": {"message": text, "type": "invalid_request_error" if status < 500
                                     else "internal_error", "param": None, "code": f"ui_http_{status}"},
                           "detail": detail}).encode()  # Gradio's own page reads detail: kept beside
        headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"content-type")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": data})
