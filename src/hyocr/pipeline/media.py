"""Untrusted bytes -> validated RGB page images.

Every limit is enforced before the expensive step it protects: the base64 length before decoding
it, the format (from magic bytes) before any Pillow plugin sees the data, the pixel count (from the
header) before pixels are decoded. Only allowlisted formats ever reach a decoder.

``probe_image`` does every check that needs no pixels; ``decode_image`` then decodes, and with a size from
``reduction_for`` reduces the image to what the engine keeps as soon as it is decoded (pipeline/memory.py).
``load_image`` is both, at full size.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from ..errors import HyocrError, InvalidMedia, PayloadTooLarge, UnsupportedMediaType
from ..types import PageImage
from .tiff import tiff_page_frames

# (format, signature test). Order matters only where signatures overlap (none do here).
_SIGNATURES: tuple[tuple[str, object], ...] = (
    ("PNG", lambda b: b.startswith(b"\x89PNG\r\n\x1a\n")),
    ("JPEG", lambda b: b.startswith(b"\xff\xd8\xff")),
    ("WEBP", lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP"),
    ("GIF", lambda b: b[:6] in (b"GIF87a", b"GIF89a")),
    ("TIFF", lambda b: b[:4] in (b"II*\x00", b"MM\x00*")),
    ("BMP", lambda b: b.startswith(b"BM") and len(b) > 14),
    ("JPEG2000", lambda b: b.startswith(b"\x00\x00\x00\x0cjP  ") or b.startswith(b"\xffO\xffQ")),
)
# Recognised, never decoded: formats whose decoders are risky or that need another pipeline
# (PDF has its own: pipeline/pdf.py renders it in a worker process).
_REFUSED: tuple[tuple[str, object], ...] = (
    ("PDF", lambda b: b.lstrip()[:5] == b"%PDF-"),
    ("EPS", lambda b: b.startswith(b"%!PS") or b.startswith(b"\xc5\xd0\xd3\xc6")),
    ("SVG", lambda b: re.match(rb"\s*(<\?xml|<svg|<!DOCTYPE svg)", b[:256], re.I) is not None),
    ("FITS", lambda b: b.startswith(b"SIMPLE  =")),
    ("PSD", lambda b: b.startswith(b"8BPS")),
    ("ICO", lambda b: b[:4] in (b"\x00\x00\x01\x00", b"\x00\x00\x02\x00")),
    ("HEIF/AVIF", lambda b: b[4:8] == b"ftyp"),
)
_ORIENTATION = 0x0112  # the EXIF tag
_TRANSPOSE = {  # EXIF orientation -> the turn that displays the image upright (as ImageOps.exif_transpose)
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_SIDES = frozenset({5, 6, 7, 8})
# The allowlisted formats as people write them, in the order messages list them.
_NAMES = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "BMP": "BMP", "TIFF": "TIFF", "GIF": "GIF",
          "JPEG2000": "JPEG 2000"}


@dataclass(frozen=True, slots=True)
class MediaLimits:
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    formats: frozenset[str] = frozenset({"PNG", "JPEG", "WEBP", "BMP", "TIFF"})
    max_pdf_bytes: int = 50 * 1024 * 1024
    max_request_pixels: int = 160_000_000  # all images of one request, from their headers

    @classmethod
    def from_settings(cls, settings) -> MediaLimits:
        return cls(settings.max_image_bytes, settings.max_image_pixels, frozenset(settings.image_formats),
                   settings.max_pdf_bytes, settings.max_request_pixels)

    def accepted(self, *, pdf: bool = False) -> str:
        return accepted_formats(self.formats, pdf=pdf)


def accepted_formats(formats: frozenset[str], *, pdf: bool = False) -> str:
    """The formats taken, for messages: "PNG, JPEG, WebP, BMP, TIFF" (and ", PDF" where PDFs are read)."""
    names = [name for fmt, name in _NAMES.items() if fmt in formats]
    return ", ".join([*names, "PDF"] if pdf else names)


def is_pdf(data: bytes) -> bool:
    return sniff_format(data) == "PDF"


def is_document(data: bytes) -> bool:
    """Pages to select and read in ranges: a PDF, or a TIFF of several pages (a fax, a scanner's document)."""
    return is_pdf(data) or len(tiff_page_frames(data, limit=2)) > 1


def check_pdf_size(data: bytes, limits: MediaLimits, *, param: str = "image") -> None:
    if len(data) > limits.max_pdf_bytes:
        raise PayloadTooLarge(f"the PDF is larger than the {limits.max_pdf_bytes} byte limit", param=param)


def sniff_format(data: bytes) -> str | None:
    head = data[:512]
    for name, test in _SIGNATURES + _REFUSED:
        if test(head):  # type: ignore[operator]
            return name
    return None


@dataclass(slots=True)
class ImageProbe:
    """An image whose header passed every check: opened, no pixels decoded yet."""

    image: Image.Image  # set to decode smaller by ``reduction_for``; None once decoded
    format: str
    header: tuple[int, int]  # width, height as stored in the file (the EXIF orientation is read on decoding:
    # Pillow decodes a whole PNG to look for its eXIf chunk)
    source_bytes: int
    index: int
    param: str

    @property
    def pixels(self) -> int:
        return self.header[0] * self.header[1]


def load_image(data: bytes, limits: MediaLimits, *, index: int = 0, param: str = "image") -> PageImage:
    """Validate and decode one image at full size. Raises 400/413/415 errors with messages safe to show."""
    return decode_image(probe_image(data, limits, index=index, param=param))


def probe_image(data: bytes, limits: MediaLimits, *, index: int = 0, param: str = "image",
                accept_pdf: bool = False, frame: int | None = None) -> ImageProbe:
    """Every check that needs no pixels: bytes, format (magic bytes), the header's size. ``accept_pdf``:
    the caller reads PDFs too (on their own path), so the messages name PDF among the formats taken.
    ``frame``: this frame, a page of a TIFF document (``tiff_page_frames``); without it the image is one
    page, and a TIFF of several pages is refused."""
    if len(data) > limits.max_image_bytes:
        raise PayloadTooLarge(
            f"image is larger than the {limits.max_image_bytes} byte limit", param=param
        )
    if not data:
        raise InvalidMedia("the file is empty", param=param)
    fmt = sniff_format(data)
    allowed = limits.accepted(pdf=accept_pdf)
    if fmt is None:
        what = "image or PDF" if accept_pdf else "image"
        raise InvalidMedia(f"file is not a recognised {what} ({allowed})", param=param)
    if fmt not in limits.formats:
        if fmt == "PDF":
            raise UnsupportedMediaType(f"PDF documents are read by /v1/ocr (one per request); here send "
                                       f"images: {allowed}", param=param)
        raise UnsupportedMediaType(f"{fmt} files are not accepted; allowed: {allowed}", param=param)
    try:
        image = Image.open(io.BytesIO(data), formats=[fmt])  # header only, no pixels yet
    except Image.DecompressionBombError:
        raise PayloadTooLarge("image has too many pixels", param=param) from None
    except Exception:
        raise InvalidMedia(f"could not read the {fmt} image header", param=param) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise InvalidMedia("image has no pixels", param=param)
    if width * height > limits.max_image_pixels:
        raise PayloadTooLarge(
            f"image is {width}x{height} = {width * height} pixels; "
            f"the limit is {limits.max_image_pixels}",
            param=param,
        )
    if fmt == "TIFF" and frame is None and len(tiff_page_frames(data, limit=2)) > 1:  # a fax's, a scanner's
        raise InvalidMedia("this TIFF holds several pages, read as a document on its own (as a PDF is, by "
                           "/v1/ocr and /v1/jobs); here an image is one page", param=param, code="multi_page_tiff")
    if frame:  # a later page of a TIFF document: sought, and its own size held to the caps
        return frame_probe(image, len(data), limits, frame=frame, index=index, param=param)
    try:
        image.seek(0)  # an animation's first frame
    except Exception:
        raise InvalidMedia(f"the {fmt} image is truncated or corrupt", param=param) from None
    return ImageProbe(image, fmt, (width, height), len(data), index, param)


def frame_probe(image: Image.Image, source_bytes: int, limits: MediaLimits, *, frame: int, index: int,
                param: str) -> ImageProbe:
    """Page ``frame`` of a TIFF ``probe_image`` opened, sought forward from where it is (a document's pages
    in one pass over its headers; opened afresh, each page would walk from the first), held to the caps."""
    try:
        image.seek(frame)
    except Exception:
        raise InvalidMedia("the TIFF image is truncated or corrupt", param=param) from None
    width, height = image.size
    if width < 1 or height < 1 or width * height > limits.max_image_pixels:
        raise PayloadTooLarge(f"page {index + 1} is {width}x{height} pixels; the limit is {limits.max_image_pixels}",
                              param=param)
    return ImageProbe(image, "TIFF", (width, height), source_bytes, index, param)


def check_request_pixels(probes: list[ImageProbe], limits: MediaLimits) -> None:
    """413 when the images of one request declare more pixels than ``max_request_pixels`` together."""
    total = 0
    for probe in probes:
        total += probe.pixels
        if total > limits.max_request_pixels:
            grand = sum(p.pixels for p in probes)
            raise PayloadTooLarge(
                f"the {len(probes)} images of this request are {grand} pixels together; the limit per "
                f"request is {limits.max_request_pixels}: send fewer or smaller images per request",
                param=probe.param, code="too_many_pixels",
            )


def reduction_for(probe: ImageProbe, keep) -> tuple[int, int] | None:
    """Prepare ``probe`` to be decoded no larger than ``keep`` (a ``KeepSize``) allows: the size to reduce
    it to, as stored (before orientation), or None to decode it as it is. A JPEG is set to decode at the
    smallest DCT scale that is still at least that size (Pillow's draft), so its full size never exists.
    The engines' bounds treat both sides alike, so the size as stored is the turned page's size turned."""
    stored = keep.target(*probe.header) if keep is not None else None
    if stored is None:
        return None
    if probe.format == "JPEG":
        try:
            probe.image.draft(None, stored)
        except Exception:
            raise InvalidMedia("the JPEG image is truncated or corrupt", param=probe.param) from None
    return stored


_BYTES_PER_PIXEL = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}  # else 4
_WIDE = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")  # 16/32-bit: stretched to 8 bits with numpy
_RESIZABLE = ("L", "LA", "RGB", "RGBA")


def decode_cost(probe: ImageProbe, stored: tuple[int, int] | None) -> int:
    """Bytes ``decode_image`` may hold at its peak (Pillow keeps RGB in 4 bytes a pixel): the decoded image,
    a converted copy where its mode needs one, the resize's intermediate and what comes out of it."""
    mode, (width, height) = probe.image.mode, probe.image.size
    pixels = width * height
    transparent = "transparency" in probe.image.info
    alpha = mode in ("P", "PA", "LA", "RGBA", "La", "RGBa") or transparent
    cost = _BYTES_PER_PIXEL.get(mode, 4) * pixels
    if mode in _WIDE:
        cost += 12 * pixels  # numpy: the raw copy, 32-bit working values, the 8-bit grey and its alpha
    elif mode not in _RESIZABLE or transparent:
        cost += 4 * pixels  # P, 1, CMYK, a transparent key colour, ... -> L or RGB(A) at full size
    out = pixels if stored is None else stored[0] * stored[1]
    if stored is not None:
        cost += 4 * stored[0] * height + 4 * out  # the horizontal pass, the reduced image
        if alpha:
            cost += 4 * pixels  # resizing with alpha goes through a premultiplied copy
    if probe.format in ("JPEG", "TIFF", "WEBP", "PNG"):
        cost += 4 * out  # an EXIF turn (known only once decoded) makes a copy
    if alpha:
        cost += 3 * 4 * out  # flattened onto white: background, composite, RGB
    elif mode != "RGB":
        cost += 4 * out  # to RGB
    return cost


def decode_image(probe: ImageProbe, stored: tuple[int, int] | None = None) -> PageImage:
    """Decode a probed image to RGB. With ``stored`` (from ``reduction_for``) it is reduced to that size as
    soon as it is decoded, before anything else is done with it, and comes back as a ``PageImage`` that
    keeps the original width and height; the full-size pixels are dropped here."""
    image, fmt, param = probe.image, probe.format, probe.param
    try:
        orientation = image.getexif().get(_ORIENTATION, 1)
        if stored is None:
            # exif_transpose copies the whole image even when there is nothing to turn (2.6 MB a card,
            # the largest single cost of a request in a profile): only call it for a real rotation.
            if orientation != 1:
                image = ImageOps.exif_transpose(image) or image
            return PageImage(image=_to_rgb(image), index=probe.index, source_format=fmt,
                             source_bytes=probe.source_bytes)
        image.load()
        probe.image = image = _resizable(image)  # drop the decoded source as soon as it is converted
        if image.size != stored:
            image = image.resize(stored, Image.Resampling.BICUBIC)  # what the model engines' own resize does
        probe.image = image  # the full-size buffer is freed here (nothing else refers to it)
        method = _TRANSPOSE.get(orientation) if isinstance(orientation, int) else None
        if method is not None:
            image = image.transpose(method)
        width, height = probe.header
        original = (height, width) if orientation in _SWAPS_SIDES else (width, height)
        rgb = _to_rgb(image)
    except Image.DecompressionBombError:
        raise PayloadTooLarge("image has too many pixels", param=param) from None
    except HyocrError:
        raise
    except Exception:
        raise InvalidMedia(f"the {fmt} image is truncated or corrupt", param=param) from None
    finally:
        probe.image = None  # type: ignore[assignment]
    return PageImage(image=rgb, index=probe.index, source_format=fmt, source_bytes=probe.source_bytes,
                     size=original)


def _resizable(image: Image.Image) -> Image.Image:
    """A decoded image in a mode Pillow resizes properly (L, LA, RGB, RGBA), at full size. Transparency is
    turned into an alpha channel first: a transparent key colour would not survive the resampling."""
    if image.mode in _WIDE:
        image = _to_8bit(image)
    if image.mode in ("P", "PA") or (image.mode in ("L", "RGB") and "transparency" in image.info):
        return image.convert("RGBA")
    if image.mode == "1":
        return image.convert("L")
    if image.mode not in _RESIZABLE:
        return image.convert("RGBA" if image.mode in ("La", "RGBa") else "RGB")
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """Any mode -> 8-bit RGB; transparency is flattened onto white (how a page is printed)."""
    image.load()
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        image = _to_8bit(image)
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB") if image.mode != "RGB" else image


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit scans keep their tones (/257); 32-bit int and float images are stretched to 0-255.

    Integer / float32 arithmetic keeps a 40 MP page within a few hundred MB. A 16-bit PNG's tRNS
    grey becomes an alpha channel, so the caller flattens it onto white.
    """
    raw = np.asarray(image)
    if image.mode.startswith("I;16"):
        grey8 = ((raw.astype(np.uint32) + 128) // 257).astype(np.uint8)
    else:
        values = raw.astype(np.float32)
        lo, hi = float(values.min()), float(values.max())
        if hi > lo:
            values = (values - lo) * (255.0 / (hi - lo))
        grey8 = np.clip(values + 0.5, 0, 255).astype(np.uint8)
    grey = Image.fromarray(grey8, "L")
    transparent = image.info.get("transparency")
    if isinstance(transparent, int):
        grey.putalpha(Image.fromarray(np.where(raw == transparent, 0, 255).astype(np.uint8), "L"))
    return grey
