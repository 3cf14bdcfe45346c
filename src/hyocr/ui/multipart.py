"""The upload rules, checked on a multipart body as it streams (ui/uploads.py's guard feeds it each chunk
before Gradio sees it); the first thing the rules do not allow raises ``UploadRefused`` with the API's error:

- size: per file as it streams, an image over ``MAX_IMAGE_BYTES``, a PDF over ``MAX_PDF_BYTES`` (413);
- format: each file's first bytes, sniffed by the API's own ``sniff_format`` (never its name): only the
  ``IMAGE_FORMATS`` and PDF (400 not recognised, 415 recognised but refused); empty files (400);
- shape: at most ``MAX_IMAGES_PER_REQUEST`` files, in the ``files`` field Gradio reads (a file in any other
  field would be left in Gradio's folder for ever), small text fields, a complete multipart body (400).

The body is parsed with the parser and header rules Gradio's own upload route uses, so both read the same
parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import HyocrError, InvalidMedia, InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from ..pipeline.media import accepted_formats, sniff_format

if TYPE_CHECKING:
    from ..config import Settings

FILES_FIELD = "files"  # the only form field Gradio's upload route reads
SNIFF_BYTES = 512  # what sniff_format looks at
MAX_HEADER_BYTES = 8 * 1024  # per part, as Gradio's parser
MAX_FIELD_BYTES = 64 * 1024  # text fields: Gradio's browser client sends none


@dataclass(frozen=True)
class UploadRules:
    """The API's limits, as they apply to one upload request."""

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
        return accepted_formats(self.formats, pdf=True)


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


class MultipartInspector:
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
