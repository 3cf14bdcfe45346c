"""The UI's file uploads under the API's rules: a pure ASGI guard in front of the mounted Gradio app.

Gradio's ``POST /ui/gradio_api/upload`` stores whatever it is sent (one file per content hash and name,
readable again at ``/ui/gradio_api/file=...``), checking only ``max_file_size`` per file. In front of it,
``UploadGuard`` parses the same multipart stream as it arrives, before Gradio sees each chunk, and refuses
with the API's JSON errors:

- size: ``Content-Length`` over what an upload may be (413 before any byte is read), then per file as it
  streams: an image over ``MAX_IMAGE_BYTES``, a PDF over ``MAX_PDF_BYTES`` (413);
- format: each file's first bytes, sniffed by the API's own ``sniff_format`` (never its name): only the
  ``IMAGE_FORMATS`` and PDF (400 not recognised, 415 recognised but refused); empty files (400);
- shape: at most ``MAX_IMAGES_PER_REQUEST`` files, in the ``files`` field Gradio reads (a file in any other
  field would be left in Gradio's folder for ever), small text fields, a complete multipart body (400);
- space: the bytes the UI keeps (uploads and the files its results are served from) stay under
  ``UI_UPLOAD_CACHE_BYTES``; an upload that would pass it first evicts the least recently used files (an
  upload larger than the whole cache: 413; room held by uploads still arriving: 503).

A refusal mid-body reaches Gradio as a multipart parse error, the one failure on which its parser deletes
the temporary files it has begun (a client that hangs up or a body cap hit upstream is passed on the same
way, then re-raised for the outer middleware to answer as for the API). Who may upload (401/403) and how
often (429) are settled before this, by the app's auth and rate-limit middleware, as for every route.

Gradio's ``process_recording`` route (screen recordings; this UI has none) keeps every body it is sent in
the temporary folder: it answers 404 here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api.errors import error_headers, hyocr_error_body
from ..errors import (
    HyocrError,
    InvalidMedia,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from ..pipeline.media import sniff_format

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger("hyocr.ui")

UPLOAD_PATH = "/gradio_api/upload"  # relative to the mount
REFUSED_PATHS = frozenset({"/gradio_api/process_recording"})
FILES_FIELD = "files"  # the only form field Gradio's upload route reads
SNIFF_BYTES = 512  # what sniff_format looks at
MAX_HEADER_BYTES = 8 * 1024  # per part, as Gradio's parser
MAX_FIELD_BYTES = 64 * 1024  # text fields: Gradio's browser client sends none
_NAMES = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "BMP": "BMP", "TIFF": "TIFF", "GIF": "GIF",
          "JPEG2000": "JPEG 2000"}
_ORDER = tuple(_NAMES)


@dataclass(frozen=True)
class UploadRules:
    formats: frozenset[str]
    max_image_bytes: int
    max_pdf_bytes: int
    max_files: int
    max_request_bytes: int  # a whole upload body

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadRules:
        most = max(settings.max_pdf_bytes, settings.max_images_per_request * settings.max_image_bytes)
        overhead = 16 * 1024 + settings.max_images_per_request * (MAX_HEADER_BYTES + 256)  # part headers
        return cls(frozenset(settings.image_formats), settings.max_image_bytes, settings.max_pdf_bytes,
                   settings.max_images_per_request, min(settings.max_body_bytes, most + overhead))

    def accepted(self) -> str:
        return ", ".join([_NAMES[f] for f in _ORDER if f in self.formats] + ["PDF"])


class UploadRefused(MultipartParseError):
    """Raised into Gradio's multipart parser: the exception type on which it deletes the temporary files
    it has begun. ``error`` is the client's answer (None: an upstream failure, re-raised afterwards)."""

    def __init__(self, error: HyocrError | None) -> None:
        super().__init__(error.message if error else "upload aborted")
        self.error = error


@dataclass
class _Part:
    headers_size: int = 0
    disposition: bytes = b""
    name: str = ""
    filename: str | None = None  # None: a text field
    head: bytes = b""
    size: int = 0
    cap: int | None = None  # known once the format is
    kind: str = "image"


class _Inspector:
    """Follows one multipart body, as Gradio's parser will read it (the same parser and header rules),
    and raises ``UploadRefused`` at the first thing the rules do not allow."""

    def __init__(self, boundary: bytes, charset: str, rules: UploadRules) -> None:
        self.rules = rules
        self.charset = charset
        self.part = _Part()
        self.files = 0
        self.field_bytes = 0
        self.ended = False
        self._header_name = b""
        self._header_value = b""
        self.parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_part_data": self._data, "on_part_end": self._end,
            "on_header_field": self._header_field, "on_header_value": self._header_val,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done, "on_end": self._done,
        })

    def write(self, chunk: bytes) -> None:
        try:
            self.parser.write(chunk)
        except UploadRefused:
            raise
        except MultipartParseError:
            raise UploadRefused(InvalidRequest("the upload is not a well-formed multipart body")) from None

    def finish(self) -> None:
        if not self.ended:
            raise UploadRefused(InvalidRequest("the upload's multipart body is incomplete"))

    # python_multipart callbacks
    def _begin(self) -> None:
        self.part = _Part()

    def _count_header(self, n: int) -> None:
        self.part.headers_size += n
        if self.part.headers_size > MAX_HEADER_BYTES:
            raise UploadRefused(InvalidRequest("a part of the upload has too large headers"))

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_name += data[start:end]

    def _header_val(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            self.part.disposition = self._header_value
        self._header_name = self._header_value = b""

    def _headers_done(self) -> None:
        _, options = parse_options_header(self.part.disposition)
        if b"name" not in options:
            raise UploadRefused(InvalidRequest("a part of the upload has no form field name"))
        self.part.name = options[b"name"].decode(self.charset, errors="replace")
        if b"filename" not in options:  # how Gradio tells a file from a text field
            return
        self.part.filename = Path(options[b"filename"].decode(self.charset, errors="replace")).name[:200] or "file"
        if self.part.name != FILES_FIELD:
            raise UploadRefused(InvalidRequest(f"files are uploaded in the {FILES_FIELD!r} field",
                                               param=self.part.filename))
        self.files += 1
        if self.files > self.rules.max_files:
            raise UploadRefused(InvalidRequest(f"at most {self.rules.max_files} files per upload"))

    def _data(self, data: bytes, start: int, end: int) -> None:
        part = self.part
        if part.filename is None:
            self.field_bytes += end - start
            if self.field_bytes > MAX_FIELD_BYTES:
                raise UploadRefused(PayloadTooLarge(f"the upload's text fields are over {MAX_FIELD_BYTES} bytes"))
            return
        part.size += end - start
        if part.cap is None:
            part.head += data[start:min(end, start + SNIFF_BYTES - len(part.head))]
            if len(part.head) >= SNIFF_BYTES:
                self._judge(part)
        if part.cap is not None and part.size > part.cap:
            raise UploadRefused(PayloadTooLarge(f"{part.filename}: the {part.kind} is larger than the {part.cap} "
                                                "byte limit", param=part.filename))

    def _end(self) -> None:
        part = self.part
        if part.filename is None:
            return
        if part.size == 0:
            raise UploadRefused(InvalidMedia(f"{part.filename}: the file is empty", param=part.filename))
        if part.cap is None:
            self._judge(part)

    def _done(self) -> None:
        self.ended = True

    def _judge(self, part: _Part) -> None:
        """The format from the content, as the API sniffs it: the cap that applies, or a refusal."""
        fmt = sniff_format(part.head)
        name = part.filename
        if fmt == "PDF":
            part.cap, part.kind = self.rules.max_pdf_bytes, "PDF"
        elif fmt in self.rules.formats:
            part.cap = self.rules.max_image_bytes
        elif fmt is None:
            raise UploadRefused(InvalidMedia(f"{name}: file is not a recognised image or PDF "
                                             f"({self.rules.accepted()})", param=name))
        else:
            raise UploadRefused(UnsupportedMediaType(f"{name}: {fmt} files are not accepted; allowed: "
                                                     f"{self.rules.accepted()}", param=name))


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
        if path in REFUSED_PATHS:
            await _send_error(scope, send, NotFound("not found"))
            return
        if path != UPLOAD_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
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

    def _start(self, scope: Scope) -> tuple[_Inspector, int | None]:
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
        return _Inspector(params[b"boundary"], charset, self.rules), int(declared) if declared else None

    async def _forward(self, scope: Scope, receive: Receive, send: Send, inspector: _Inspector,
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
            except Exception as exc:  # a body cap or timeout upstream: Gradio cleans up, the outer layer answers
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
