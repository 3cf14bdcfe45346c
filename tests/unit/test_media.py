"""hyocr.pipeline.media: untrusted bytes -> validated RGB pages (docs/SECURITY.md, "Input").

Every image is generated here with Pillow; nothing is mocked.
"""

from __future__ import annotations

import base64
import io
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from hyocr.config import Settings
from hyocr.errors import HyocrError, InvalidMedia, PayloadTooLarge, UnsupportedMediaType
from hyocr.pipeline.encoded import decode_base64
from hyocr.pipeline.media import MediaLimits, load_image, sniff_format

DEFAULT = MediaLimits()
WITH_GIF = MediaLimits(formats=DEFAULT.formats | {"GIF"})
WHITE, BLACK, RED, BLUE = (255, 255, 255), (0, 0, 0), (255, 0, 0), (0, 0, 255)


# --------------------------------------------------------------------------- helpers


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def png(size=(4, 3), color=RED) -> bytes:
    return encode(Image.new("RGB", size, color), "PNG")


def png_declaring(width: int, height: int) -> bytes:
    """A valid 1x1 PNG whose IHDR is patched (CRC fixed) to claim width x height."""
    data = bytearray(encode(Image.new("L", (1, 1)), "PNG"))
    assert data[12:16] == b"IHDR"
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def noisy_jpeg(size=(64, 64)) -> bytes:
    return encode(Image.effect_noise(size, 60).convert("RGB"), "JPEG", quality=90)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def assert_rgb(page, size):
    assert page.image.mode == "RGB"
    assert page.image.size == size == (page.width, page.height)


# --------------------------------------------------------------------------- MediaLimits


def test_default_limits_and_allowlist():
    assert DEFAULT.max_image_bytes == 20 * 1024 * 1024
    assert DEFAULT.max_image_pixels == 40_000_000
    assert DEFAULT.formats == {"PNG", "JPEG", "WEBP", "BMP", "TIFF"}
    assert not DEFAULT.formats & {"GIF", "JPEG2000", "PDF", "SVG", "EPS"}
    with pytest.raises(AttributeError):  # frozen
        DEFAULT.max_image_bytes = 1  # type: ignore[misc]


def test_limits_from_settings():
    s = Settings(_env_file=None, max_image_bytes=4096, max_image_pixels=5000, image_formats="png,jpeg2000")
    limits = MediaLimits.from_settings(s)
    assert limits == MediaLimits(4096, 5000, frozenset({"PNG", "JPEG2000"}))
    assert load_image(png(), limits).source_format == "PNG"
    page = load_image(REFUSED["JPEG2000"], limits)  # opted in: decodes
    assert (page.source_format, page.image.mode, page.image.getpixel((5, 5))) == ("JPEG2000", "RGB", RED)
    with pytest.raises(UnsupportedMediaType):
        load_image(noisy_jpeg(), limits)


# --------------------------------------------------------------------------- decoding to RGB

ALLOWED = [("PNG", {}), ("JPEG", {}), ("WEBP", {"lossless": True}), ("BMP", {}), ("TIFF", {})]


@pytest.mark.parametrize(("fmt", "options"), ALLOWED, ids=[f for f, _ in ALLOWED])
def test_every_allowed_format_decodes_to_rgb(fmt, options):
    data = encode(Image.new("RGB", (37, 23), RED), fmt, **options)
    page = load_image(data, DEFAULT, index=3)
    assert_rgb(page, (37, 23))
    assert (page.index, page.source_format, page.source_bytes) == (3, fmt, len(data))
    r, g, b = page.image.getpixel((18, 11))
    assert r > 240 and g < 15 and b < 15
    assert sniff_format(data) == fmt
    assert decode_base64(f"data:image/{fmt.lower()};base64,{b64(data)}", DEFAULT) == data


def _palette():
    image = Image.new("P", (8, 4), 0)
    image.putpalette([0, 0, 0, 0, 0, 255])
    image.putpixel((0, 0), 1)
    return image


MODES = {  # name: (source image, format, save options, expected pixel at (0, 0))
    "L": (lambda: Image.new("L", (8, 4), 200), "PNG", {}, (200, 200, 200)),
    "P": (_palette, "PNG", {}, BLUE),
    "P-trns-opaque": (_palette, "PNG", {"transparency": 0}, BLUE),
    "P-trns-clear": (_palette, "PNG", {"transparency": 1}, WHITE),
    "L-trns": (lambda: Image.new("L", (8, 4), 7), "PNG", {"transparency": 7}, WHITE),
    "RGB-trns": (lambda: Image.new("RGB", (8, 4), BLUE), "PNG", {"transparency": BLUE}, WHITE),
    "1": (lambda: Image.new("1", (8, 4), 1), "PNG", {}, WHITE),
    "1-tiff": (lambda: Image.new("1", (8, 4), 0), "TIFF", {}, BLACK),
    "1-bmp": (lambda: Image.new("1", (8, 4), 1), "BMP", {}, WHITE),
    "LA-transparent": (lambda: Image.new("LA", (8, 4), (0, 0)), "PNG", {}, WHITE),
    "LA-opaque": (lambda: Image.new("LA", (8, 4), (0, 255)), "PNG", {}, BLACK),
    "CMYK-jpeg": (lambda: Image.new("CMYK", (8, 4), (0, 0, 0, 0)), "JPEG", {}, WHITE),
    "CMYK-tiff": (lambda: Image.new("CMYK", (8, 4), (0, 255, 255, 0)), "TIFF", {}, RED),
}


@pytest.mark.parametrize("name", MODES)
def test_modes_become_8bit_rgb(name):
    make, fmt, options, expected = MODES[name]
    source = make()
    data = encode(source, fmt, **options)
    assert Image.open(io.BytesIO(data)).mode == source.mode  # the file really has that mode
    page = load_image(data, DEFAULT)
    assert_rgb(page, (8, 4))
    assert all(abs(a - b) <= 3 for a, b in zip(page.image.getpixel((0, 0)), expected))


SIXTEEN = [(m, f, p) for p in (0, 65535) for m, f in (("I;16", "PNG"), ("I;16", "TIFF"), ("I;16B", "TIFF"))]


@pytest.mark.parametrize(("mode", "fmt", "paper"), SIXTEEN)
def test_sixteen_bit_grey_becomes_8_bits(mode, fmt, paper):
    """I;16B is a big-endian ("MM") TIFF. Paper 65535 is a flat page: white must stay white."""
    source = Image.new(mode, (8, 4), paper)
    source.putpixel((7, 3), 65535)
    data = encode(source, fmt)
    assert Image.open(io.BytesIO(data)).mode == mode
    page = load_image(data, DEFAULT)
    assert_rgb(page, (8, 4))
    assert page.image.getpixel((0, 0)) == (WHITE if paper else BLACK)
    assert page.image.getpixel((7, 3)) == WHITE


def test_sixteen_bit_png_transparency_flattens_to_white():
    source = Image.new("I;16", (8, 4), 1000)  # 1000 is the tRNS (transparent) grey
    source.putpixel((0, 0), 0)
    source.putpixel((7, 3), 2000)
    page = load_image(encode(source, "PNG", transparency=1000), DEFAULT)
    assert page.image.getpixel((0, 0)) == BLACK
    assert page.image.getpixel((3, 2)) == WHITE


@pytest.mark.parametrize(("fmt", "options"), [("PNG", {}), ("WEBP", {"lossless": True}), ("TIFF", {})])
def test_rgba_transparency_flattens_onto_white(fmt, options):
    source = Image.new("RGBA", (6, 6), (0, 0, 0, 0))
    source.putpixel((1, 1), (255, 0, 0, 255))
    source.putpixel((2, 2), (0, 0, 0, 128))
    page = load_image(encode(source, fmt, **options), DEFAULT)
    assert_rgb(page, (6, 6))
    assert page.image.getpixel((0, 0)) == WHITE
    assert page.image.getpixel((1, 1)) == RED
    assert all(120 <= c <= 135 for c in page.image.getpixel((2, 2)))  # half-transparent black


def test_exif_orientation_is_applied():
    source = Image.new("RGB", (40, 20), WHITE)
    source.paste(RED, (0, 0, 10, 20))  # left edge red
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    page = load_image(encode(source, "JPEG", exif=exif.tobytes(), quality=95), DEFAULT)
    assert_rgb(page, (20, 40))
    assert page.image.getpixel((10, 3))[1] < 40  # the left edge is now the top
    assert page.image.getpixel((10, 36)) == pytest.approx(WHITE, abs=6)


def _frames(fmt: str, **options) -> bytes:
    frames = [Image.new("RGB", (10, 6), color) for color in (RED, BLUE, BLACK)]
    return encode(frames[0], fmt, save_all=True, append_images=frames[1:], **options)


@pytest.mark.parametrize("fmt", ["GIF", "WEBP"])  # animations; a TIFF's frames are pages (below)
def test_multi_frame_files_give_the_first_frame(fmt):
    data = _frames(fmt, lossless=True) if fmt == "WEBP" else _frames(fmt)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    page = load_image(data, WITH_GIF)
    assert_rgb(page, (10, 6))
    assert page.source_format == fmt and page.image.getpixel((5, 3)) == RED


def test_gif_is_outside_the_default_allowlist():
    with pytest.raises(UnsupportedMediaType, match="GIF") as exc:
        load_image(_frames("GIF"), DEFAULT)
    assert exc.value.status == 415 and "GIF" not in exc.value.message.split("allowed:")[1]


# --------------------------------------------------------------------------- refused formats (415)

REFUSED = {
    "PDF": b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n",
    "EPS": b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n",
    "SVG": b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
    "SVG-xml": b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>',
    "FITS": b"SIMPLE  =                    T" + b" " * 50 + b"END".ljust(2800),
    "PSD": b"8BPS\x00\x01" + b"\x00" * 6 + b"\x00\x03\x00\x00\x00\x0a\x00\x00\x00\x0a\x00\x08\x00\x03",
    "ICO": encode(Image.new("RGB", (16, 16), RED), "ICO"),
    "HEIF": b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 32,
    "JPEG2000": encode(Image.new("RGB", (10, 10), RED), "JPEG2000"),
    "JPEG2000-codestream": encode(Image.new("RGB", (10, 10), RED), "JPEG2000", no_jp2=True),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused_formats_are_415_naming_the_format(name):
    fmt = name.split("-")[0]
    assert (sniff_format(REFUSED[name]) or "").startswith(fmt)
    with pytest.raises(UnsupportedMediaType) as exc:
        load_image(REFUSED[name], DEFAULT, param="file")
    assert exc.value.status == 415 and exc.value.param == "file"
    assert fmt in exc.value.message and "PNG" in exc.value.message  # names it, lists what is allowed


def test_refused_formats_never_reach_a_decoder():
    """In a fresh interpreter, refusing every sample must not load a single Pillow plugin."""
    code = (
        "import sys\nfrom hyocr.errors import UnsupportedMediaType as E\n"
        "from hyocr.pipeline.media import MediaLimits, load_image\n"
        f"for data in {list(REFUSED.values())!r}:\n"
        "    try: load_image(data, MediaLimits())\n    except E: continue\n    raise SystemExit('accepted')\n"
        "print(sorted(m for m in sys.modules if m.endswith('ImagePlugin')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- invalid bytes (400)

_valid_png, _valid_jpeg = png((64, 64)), noisy_jpeg()
INVALID = {
    "empty": b"",
    "text": b"hello, this is not an image at all\n",
    "garbage": bytes(range(256)) * 4,
    "nul": b"\x00" * 64,
    "truncated-png": _valid_png[: len(_valid_png) // 2],
    "truncated-jpeg": _valid_jpeg[: len(_valid_jpeg) // 2],
    "png-signature-only": _valid_png[:8],
    "polyglot-png": _valid_png[:8] + b"<?php echo 1; ?>" * 20,
    "bmp-lookalike": b"BM" + b"this is text, not a bitmap",
    "riff-not-webp": b"RIFF\x10\x00\x00\x00AVI LIST" + b"\x00" * 32,
}


@pytest.mark.parametrize("name", INVALID)
def test_invalid_bytes_are_400(name):
    with pytest.raises(InvalidMedia) as exc:
        load_image(INVALID[name], DEFAULT, param="messages[0].content[1]")
    assert exc.value.status == 400 and exc.value.code == "invalid_image"
    assert exc.value.param == "messages[0].content[1]"
    assert sniff_format(INVALID[name]) in (None, "PNG", "JPEG", "BMP", "WEBP")  # never a refused one


# --------------------------------------------------------------------------- size caps (413)


def test_decompression_bomb_header_is_413_fast_and_flat():
    data = png_declaring(50_000, 50_000)
    assert len(data) < 100
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(PayloadTooLarge) as exc:
        load_image(data, DEFAULT, param="img")
    elapsed, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert exc.value.status == 413 and exc.value.param == "img"
    assert elapsed < 1.0 and peak < 20 * 1024 * 1024


def test_pixel_cap_from_header_names_the_dimensions():
    limits = MediaLimits(max_image_pixels=1_000_000)
    with pytest.raises(PayloadTooLarge, match="3000x3000") as exc:
        load_image(png_declaring(3000, 3000), limits)
    assert exc.value.status == 413 and "1000000" in exc.value.message
    assert load_image(png((1000, 1000)), limits).width == 1000  # exactly at the cap is fine


def test_byte_cap_is_checked_before_sniffing():
    limits = MediaLimits(max_image_bytes=1024)
    with pytest.raises(PayloadTooLarge, match="1024") as exc:
        load_image(b"\x00" * 1025, limits, param="p")  # not an image: the size check came first
    assert exc.value.status == 413 and exc.value.param == "p"
    data = png()
    assert load_image(data, MediaLimits(max_image_bytes=len(data))).source_bytes == len(data)


# --------------------------------------------------------------------------- decode_base64

ABC = b"any bytes \x00\xff\xfe"  # its base64 has "/" and "=": url-safe and padding cases differ
URLSAFE, WRAPPED = base64.urlsafe_b64encode(ABC).decode(), base64.encodebytes(ABC * 30).decode()
GOOD_B64 = [b64(ABC), f"  {b64(ABC)}\n", WRAPPED, b64(ABC).rstrip("="), URLSAFE, URLSAFE.rstrip("=")]
URLS = ["data:image/png;base64,", "data:image/png;charset=utf-8;base64,", "DATA:IMAGE/PNG;BASE64,"]
URLS += ["data:;base64,"]  # no media type at all


@pytest.mark.parametrize("text", GOOD_B64 + [url + b64(ABC) for url in URLS])
def test_base64_forms_are_accepted(text):
    assert decode_base64(text, DEFAULT) in (ABC, ABC * 30)


BAD_B64 = ["", "   \n", "!!!!", "QQ=Q", "Q", "QUJD\u00e9"]
BAD_URLS = ["data:image/png;base64,", "data:image/png;base64", "data:image/png,QUJD"]
BAD_URLS += ["data:image png;base64,QUJD", "data:image/png;base64;charset=utf-8,QUJD"]
NOT_STR = [None, b"QUJD", 123, ["QUJD"]]


@pytest.mark.parametrize("text", BAD_B64 + BAD_URLS + NOT_STR)
def test_bad_base64_data_urls_and_non_strings_are_400(text):
    with pytest.raises(InvalidMedia) as exc:
        decode_base64(text, DEFAULT, param="image_url")
    assert exc.value.status == 400 and exc.value.param == "image_url"


def test_huge_base64_is_413_from_its_length_without_decoding():
    huge = "A" * 30_000_000
    start = time.perf_counter()
    with pytest.raises(PayloadTooLarge) as exc:
        decode_base64(huge, MediaLimits(max_image_bytes=1 << 20), param="img")
    assert time.perf_counter() - start < 0.5
    assert exc.value.status == 413 and exc.value.param == "img"
    with pytest.raises(PayloadTooLarge):  # same for a data URL
        decode_base64("data:image/png;base64," + huge, MediaLimits(max_image_bytes=1 << 20))


@pytest.mark.parametrize("size", range(1020, 1030))
def test_base64_cap_is_exact(size):
    text, limits = b64(b"x" * size), MediaLimits(max_image_bytes=1024)
    if size <= 1024:
        assert len(decode_base64(text, limits)) == size
        assert len(decode_base64(text.rstrip("="), limits)) == size
    else:
        with pytest.raises(PayloadTooLarge):
            decode_base64(text, limits)


def test_line_wrapped_base64_at_the_cap_is_accepted():
    text = b64(b"x" * 1024)
    wrapped = "\r\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # MIME style
    assert len(decode_base64(wrapped, MediaLimits(max_image_bytes=1024))) == 1024


# --------------------------------------------------------------------------- fuzzing

SIGNATURES = [b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF\x00\x00\x00\x00WEBP", b"BM", b"II*\x00"]
SIGNATURES += [b"MM\x00*", b"GIF89a", b"\x00\x00\x00\x0cjP  \r\n\x87\n", b"\xffO\xffQ"]
VALID = [png((16, 16)), noisy_jpeg((16, 16)), _frames("GIF"), _frames("TIFF"), REFUSED["JPEG2000"]]
VALID += [encode(Image.new("RGB", (16, 16)), fmt) for fmt in ("WEBP", "BMP")]
ALL = MediaLimits(max_image_pixels=4_000_000, formats=WITH_GIF.formats | {"JPEG2000"})
LIMITS = st.sampled_from([ALL, MediaLimits(max_image_pixels=4_000_000)])
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.filterwarnings("ignore::UserWarning")  # Pillow warns about corrupt TIFF tags
@FUZZ
@given(
    st.sampled_from(SIGNATURES + VALID), st.integers(0, 300), st.binary(max_size=2048), st.booleans(), LIMITS
)
def test_arbitrary_bytes_only_raise_client_errors(seed, at, patch, truncate, limits):
    """A signature followed by arbitrary bytes, or a valid file overwritten (and cut) at ``at``."""
    data = seed[:at] + patch + (b"" if truncate else seed[at + len(patch) :])
    try:
        page = load_image(data, limits)
    except HyocrError as exc:
        assert type(exc) in (InvalidMedia, PayloadTooLarge, UnsupportedMediaType)
        assert exc.status in (400, 413, 415)
    else:
        assert page.image.mode == "RGB" and page.width * page.height <= limits.max_image_pixels


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.text(alphabet="AQZaz09+/-_=\n data:;,", max_size=200)))
def test_arbitrary_text_only_raises_client_errors_from_decode_base64(text):
    try:
        assert isinstance(decode_base64(text, DEFAULT), bytes)
    except HyocrError as exc:
        assert type(exc) is InvalidMedia and exc.status == 400


def test_an_empty_file_is_called_empty():
    with pytest.raises(InvalidMedia, match="the file is empty"):
        load_image(b"", DEFAULT)


def test_a_multi_page_tiff_is_a_document_not_its_first_page():
    """A fax or a scanner's TIFF holds a document: as one image, reading page 1 alone lost the rest without a
    word; it is refused as one image and its pages are read one by one (pipeline/inputs.py)."""
    from PIL import ImageDraw

    from hyocr.pipeline.media import decode_image, is_document, probe_image
    from hyocr.pipeline.tiff import tiff_page_frames

    pages = [Image.new("1", (600 + 10 * i, 300), 1) for i in range(3)]
    for i, page in enumerate(pages):
        ImageDraw.Draw(page).rectangle((20, 20, 60 + 40 * i, 60), fill=0)
    fax = io.BytesIO()
    pages[0].save(fax, "TIFF", save_all=True, append_images=pages[1:], compression="group4")
    data = fax.getvalue()
    with pytest.raises(InvalidMedia) as refused:
        load_image(data, MediaLimits())
    assert refused.value.code == "multi_page_tiff" and "document" in refused.value.message
    assert tiff_page_frames(data) == (0, 1, 2) and is_document(data)
    third = decode_image(probe_image(data, MediaLimits(), index=2, frame=2))
    assert third.image.size == (620, 300) and third.index == 2
    assert third.image.getpixel((130, 40)) == (0, 0, 0) and third.image.getpixel((170, 40)) == (255, 255, 255)
    single = io.BytesIO()
    pages[1].save(single, "TIFF", compression="group4")
    assert tiff_page_frames(single.getvalue()) == (0,) and not is_document(single.getvalue())
    assert load_image(single.getvalue(), MediaLimits()).image.size == (610, 300)


def test_a_chain_of_a_hundred_thousand_tiff_headers_is_walked_no_further_than_needed():
    """Pillow's n_frames walked every header, quadratically (60,000 took 18 s on a request's thread): hyocr
    reads the chain itself, at most MAX_TIFF_FRAMES headers, and only two to tell a document."""
    import struct

    from hyocr.pipeline.media import is_document
    from hyocr.pipeline.tiff import MAX_TIFF_FRAMES, tiff_page_frames

    one = io.BytesIO()
    Image.new("L", (1, 1), 255).save(one, "TIFF")
    data = bytearray(one.getvalue())
    (first,) = struct.unpack("<I", data[4:8])
    (count,) = struct.unpack("<H", data[first:first + 2])
    chain = bytearray()
    start = len(data)
    for n in range(100_000):  # an IFD of one entry (ImageWidth 1), then the next one's offset
        here = start + len(chain)
        chain += struct.pack("<HHHII", 1, 256, 4, 1, 1) + struct.pack("<I", here + 18 if n < 99_999 else 0)
    data[first + 2 + 12 * count:first + 6 + 12 * count] = struct.pack("<I", start)
    data += chain
    started = time.perf_counter()
    assert len(tiff_page_frames(bytes(data))) == MAX_TIFF_FRAMES and is_document(bytes(data))
    with pytest.raises(InvalidMedia, match="several pages"):
        load_image(bytes(data), MediaLimits())
    assert time.perf_counter() - started < 5  # a few hundred ms here; minutes before
