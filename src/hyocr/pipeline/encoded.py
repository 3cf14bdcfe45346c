"""Base64 text and ``data:`` URLs -> bytes, their decoded size checked from the text's length before anything
is decoded (a 40 MB string is refused without a 30 MB copy)."""

from __future__ import annotations

import base64
import binascii
import re

from ..errors import InvalidMedia, PayloadTooLarge
from .media import MediaLimits, is_pdf

_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?((?:;[\w-]+=[\w.-]+)*)(;base64)?,", re.I)


def decode_base64(data: str, limits: MediaLimits, *, param: str = "image", max_bytes: int | None = None,
                  accept_pdf: bool = False) -> bytes:
    """Base64 or a ``data:`` URL -> bytes, refusing oversized payloads before decoding them
    (``check_base64_size``: the image cap, or with ``accept_pdf`` the PDF cap for a PDF). ``max_bytes``
    replaces that cap, for a caller that has checked it already."""
    payload = _base64_payload(data, param)
    if max_bytes is None:
        _check_size(payload, limits, param, accept_pdf)
    elif _decoded_size(payload) > max_bytes:
        raise PayloadTooLarge(f"image is larger than the {max_bytes} byte limit", param=param)
    return _b64decode(payload, param)


def check_base64_size(data: str, limits: MediaLimits, *, param: str = "image",
                      accept_pdf: bool = False) -> None:
    """413 when base64 (or a data URL) decodes to more than its cap, known from the string's length, before
    anything is decoded: ``max_image_bytes``, or ``max_pdf_bytes`` where PDFs are taken and the first bytes
    (decoded alone) say PDF. Malformed text is left for decoding to refuse (400)."""
    _check_size(_base64_payload(data, param), limits, param, accept_pdf)


def _check_size(payload: str, limits: MediaLimits, param: str, accept_pdf: bool) -> None:
    size = _decoded_size(payload)
    if size <= limits.max_image_bytes and (not accept_pdf or size <= limits.max_pdf_bytes):
        return
    if accept_pdf and _head_is_pdf(payload):
        if size > limits.max_pdf_bytes:
            raise PayloadTooLarge(f"the PDF is larger than the {limits.max_pdf_bytes} byte limit",
                                  param=param)
    elif size > limits.max_image_bytes:
        raise PayloadTooLarge(f"image is larger than the {limits.max_image_bytes} byte limit", param=param)


def _base64_payload(data: str, param: str) -> str:
    """The base64 digits of ``data`` (a data URL's prefix taken off), whitespace and padding as sent."""
    if not isinstance(data, str) or not data.strip():
        raise InvalidMedia("image data is empty", param=param)
    payload = data.strip()
    if payload[:5].lower() == "data:":
        match = _DATA_URL.match(payload[:512])
        if match is None or not match.group(3):
            raise InvalidMedia("malformed data URL: expected data:<type>;base64,<data>", param=param)
        payload = payload[match.end() :]
    return payload


def _decoded_size(payload: str) -> int:
    # Exactly 3/4 of the base64 digits (whitespace and padding excluded); str.count scans without copying.
    return (len(payload) - sum(payload.count(c) for c in " \n\r\t=")) * 3 // 4


def _head_is_pdf(payload: str) -> bool:
    """Whether the first bytes (what ``sniff_format`` reads), decoded alone, are a PDF's."""
    head = re.sub(r"\s+", "", payload[:2048])[:684]  # 684 digits: 513 bytes
    try:
        return is_pdf(_b64decode(head[: len(head) // 4 * 4], "image"))
    except InvalidMedia:  # not base64, or too short to say: decoding the whole will tell
        return False


def _b64decode(payload: str, param: str) -> bytes:
    if any(c in payload for c in " \n\r\t"):
        payload = re.sub(r"\s+", "", payload)
    if "-" in payload or "_" in payload:  # url-safe alphabet
        payload = payload.replace("-", "+").replace("_", "/")
    payload += "=" * (-len(payload) % 4)
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidMedia("image is not valid base64", param=param) from None
    if not raw:
        raise InvalidMedia("image data is empty", param=param)
    return raw
