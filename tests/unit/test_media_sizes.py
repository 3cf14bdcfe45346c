"""Media sizes from base64 length: the image cap, the PDF cap where PDFs are read (told by the first bytes),
both before anything is decoded; the formats an unrecognised file is told about; callback header values."""

from __future__ import annotations

import base64

import pytest
from imaging import card
from pydantic import ValidationError

from hyocr.api.protocol import JobJsonRequest, OcrJsonRequest
from hyocr.errors import InvalidMedia, PayloadTooLarge
from hyocr.pipeline.encoded import check_base64_size, decode_base64
from hyocr.pipeline.media import MediaLimits, probe_image

LIMITS = MediaLimits(max_image_bytes=2048, max_pdf_bytes=8192)
PDF = b"%PDF-1.7\n" + b"x" * 4000  # between the two caps
PNG = b"\x89PNG\r\n\x1a\n" + b"x" * 4000


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_pdf_between_the_caps_is_taken_where_pdfs_are_read_and_an_image_is_not():
    assert decode_base64(b64(PDF), LIMITS, accept_pdf=True) == PDF
    assert decode_base64("data:application/pdf;base64," + b64(PDF), LIMITS, accept_pdf=True) == PDF
    with pytest.raises(PayloadTooLarge, match="2048"):  # a route that takes images only
        decode_base64(b64(PDF), LIMITS)
    with pytest.raises(PayloadTooLarge, match="image is larger than the 2048") as exc:
        decode_base64(b64(PNG), LIMITS, accept_pdf=True, param="image")
    assert exc.value.status == 413 and exc.value.param == "image"
    with pytest.raises(PayloadTooLarge, match="the PDF is larger than the 8192"):
        decode_base64(b64(PDF + b"x" * 8192), LIMITS, accept_pdf=True)


def test_the_cap_is_known_from_the_length_before_decoding():
    """Past the head the text is not base64 at all: a decoder would say 400; the length says 413 first."""
    head = b64(PNG[:600])
    with pytest.raises(PayloadTooLarge):
        check_base64_size(head + "!" * 4000, LIMITS, accept_pdf=True)
    with pytest.raises(PayloadTooLarge, match="PDF"):
        check_base64_size(b64(PDF[:600]) + "!" * 20_000, LIMITS, accept_pdf=True)
    check_base64_size(b64(PDF[:600]) + "!" * 4000, LIMITS, accept_pdf=True)  # within its cap: decoding says
    with pytest.raises(InvalidMedia):
        decode_base64(b64(PDF[:600]) + "!" * 4000, LIMITS, accept_pdf=True)
    wrapped = base64.encodebytes(PDF).decode()  # MIME line breaks inside the head
    assert decode_base64(wrapped, LIMITS, accept_pdf=True) == PDF


def test_an_unrecognised_file_is_told_the_formats_the_caller_reads():
    with pytest.raises(InvalidMedia) as exc:
        probe_image(b"not a document", MediaLimits(), accept_pdf=True, param="file")
    assert exc.value.message == "file is not a recognised image or PDF (PNG, JPEG, WebP, BMP, TIFF, PDF)"
    with pytest.raises(InvalidMedia) as exc:  # the chat routes read images only: no PDF invited
        probe_image(b"not a document", MediaLimits(formats=frozenset({"PNG", "JPEG"})), param="image_url")
    assert exc.value.message == "file is not a recognised image (PNG, JPEG)"


def test_media_fields_are_not_held_to_the_text_cap_but_text_fields_are():
    image = b64(card().png()) + "A" * 1_500_000
    assert OcrJsonRequest(image=image, images=[image]).image == image
    with pytest.raises(ValidationError, match="1000000"):
        OcrJsonRequest(image="QUJD", question="x" * 1_000_001)


REFUSED_VALUES = [("café", "ASCII"), ("名前", "ASCII"), ("\x80", "ASCII"), ("a\rb", "control"),
                  ("a\x00b", "control"), ("a\x7fb", "control"), ("x" * 4097, "4096")]


@pytest.mark.parametrize(("value", "says"), REFUSED_VALUES)
def test_callback_header_values_http_cannot_carry_are_refused(value, says):
    with pytest.raises(ValidationError, match=says) as exc:
        JobJsonRequest(callback_headers={"X-Note": value})
    assert "X-Note" in str(exc.value)


def test_callback_header_values_lose_the_whitespace_around_them():
    got = JobJsonRequest(callback_headers={"Authorization": " Bearer a\tb  ", "X-Empty": ""}).callback_headers
    assert got == {"Authorization": "Bearer a\tb", "X-Empty": ""}
    with pytest.raises(ValidationError, match="not an HTTP header name"):
        JobJsonRequest(callback_headers={"X Note": "1"})
