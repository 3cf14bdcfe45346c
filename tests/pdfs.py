"""Real PDFs for the tests, made at test time: text pages with a text layer (PDFium writing the base-14
fonts), scanned-looking pages without one (Pillow images saved as PDF), and hostile documents
written byte by byte (encrypted, truncated, cyclic, thousands of pages, giant MediaBox).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import zlib

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
from imaging import Line, render

A4 = (595, 842)  # points


def text_pdf(pages: list[list[str]], *, size: float = 20, page_size: tuple[int, int] = A4,
             font: bytes = b"Helvetica") -> bytes:
    """One page per list of lines, typeset in a base-14 font: real vector text with a text layer."""
    pdf = pdfium.PdfDocument.new()
    for lines in pages:
        page = pdf.new_page(*page_size)
        handle = pdfium_c.FPDFText_LoadStandardFont(pdf, font)
        y = page_size[1] - 90
        for line in lines:
            obj = pdfium_c.FPDFPageObj_CreateTextObj(pdf, handle, float(size))
            text = ctypes.create_string_buffer((line + "\x00").encode("utf-16-le"))
            pdfium_c.FPDFText_SetText(obj, ctypes.cast(text, ctypes.POINTER(pdfium_c.FPDF_WCHAR)))
            pdfium_c.FPDFPageObj_Transform(obj, 1, 0, 0, 1, 60, y)
            pdfium_c.FPDFPage_InsertObject(page, obj)
            y -= size * 2
        pdfium_c.FPDFPage_GenerateContent(page)
        page.close()
    out = io.BytesIO()
    pdf.save(out)
    pdf.close()
    return out.getvalue()


def scanned_pdf(pages: list[list[str]], *, dpi: int = 150) -> bytes:
    """Pages that are pictures of text (as from a scanner): no text layer at all."""
    width, height = round(A4[0] * dpi / 72), round(A4[1] * dpi / 72)
    images = [render([Line(text, (90, 120 + 90 * i), 40) for i, text in enumerate(lines)], size=(width, height)).image
              for lines in pages]
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=dpi, save_all=True, append_images=images[1:])
    return out.getvalue()


def build_pdf(objects: list[bytes], *, trailer: bytes = b"") -> bytes:
    """A PDF from its objects' bodies (object n is ``objects[n-1]``), with a correct xref table."""
    out = bytearray(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    return bytes(out)


def one_page(media_box: bytes, content: bytes = b"") -> bytes:
    stream = b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content)
    return build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                      b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                      b"<< /Type /Page /Parent 2 0 R /MediaBox %s /Contents 4 0 R >>" % media_box,
                      stream])


CYCLIC = {
    # The page tree is its own kid.
    "tree-contains-itself": [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [2 0 R] /Count 1 >>"],
    # Two page-tree nodes, each the other's kid.
    "two-node-cycle": [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                       b"<< /Type /Pages /Parent 2 0 R /Kids [2 0 R] /Count 1 >>"],
    # An object that is a reference to itself, where the page tree should be.
    "self-reference": [b"<< /Type /Catalog /Pages 2 0 R >>", b"2 0 R"],
    # A huge /Count over a cycle.
    "count-over-cycle": [b"<< /Type /Catalog /Pages 2 0 R >>",
                         b"<< /Type /Pages /Kids [3 0 R] /Count 1000000000 >>",
                         b"<< /Type /Pages /Parent 2 0 R /Kids [2 0 R 3 0 R] /Count 1000000000 >>"],
}


def cyclic_pdf(kind: str) -> bytes:
    return build_pdf(CYCLIC[kind])


def partly_cyclic_pdf() -> bytes:
    """A page tree that contains itself next to one real page: the page is read, the loop is an error page."""
    return build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                      b"<< /Type /Pages /Kids [3 0 R 2 0 R] /Count 2 >>",
                      b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>"])


def many_pages_pdf(count: int) -> bytes:
    """``count`` small blank pages sharing one page tree (cheap to write, cheap to open)."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(count))
    pages = [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>"] * count
    return build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                      b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count), *pages])


# ------------------------------------------------------------------ encryption (RC4, revision 2)

_PAD = bytes.fromhex("28bf4e5e4e758a4164004e56fffa01082e2e00b6d0683e802f0ca9fe6453697a")


def _rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out, i, j = bytearray(), 0, 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def encrypted_pdf(user_password: bytes = b"secret", owner_password: bytes = b"owner") -> bytes:
    """A one-page PDF under the standard security handler (40-bit RC4, the PDF 1.1 algorithms),
    its content stream encrypted. An empty user password opens without one (permissions only)."""
    file_id = hashlib.md5(b"hyocr-test").digest()
    permissions = -44
    owner = _rc4(hashlib.md5((owner_password + _PAD)[:32]).digest()[:5], (user_password + _PAD)[:32])
    key = hashlib.md5((user_password + _PAD)[:32] + owner + permissions.to_bytes(4, "little", signed=True)
                      + file_id).digest()[:5]
    user = _rc4(key, _PAD)
    content = b"BT /F1 24 Tf 72 700 Td (ENCRYPTED PAGE TEXT) Tj ET"
    object_key = hashlib.md5(key + (4).to_bytes(3, "little") + (0).to_bytes(2, "little")).digest()[:10]
    sealed = _rc4(object_key, content)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R "
                b"/Resources << /Font << /F1 6 0 R >> >> >>"),
               b"<< /Length %d >>\nstream\n" % len(sealed) + sealed + b"\nendstream",
               (b"<< /Filter /Standard /V 1 /R 2 /O <%s> /U <%s> /P %d >>"
                % (owner.hex().encode(), user.hex().encode(), permissions)),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    return build_pdf(objects, trailer=b"/Encrypt 5 0 R /ID [<%s> <%s>]" % (file_id.hex().encode(),
                                                                         file_id.hex().encode()))


def slow_pdf(strokes: int = 200_000) -> bytes:
    """One small page whose (compressed, ~25 kB) content draws ``strokes`` lines: PDFium takes seconds
    per 100k, the cheap way to make a document that renders too slowly."""
    ops = b"".join(b"%d %d m %d %d l S\n" % (i % 200, i * 7 % 200, i * 13 % 200, i * 3 % 200) for i in range(strokes))
    content = zlib.compress(ops, 9)
    return build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                      b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
                      b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 4 0 R >>",
                      b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(content) + content + b"\nendstream"])


def mixed_pdf(typeset: list[str], scanned: list[str]) -> bytes:
    """Page 1 typeset (a text layer), page 2 a picture of text (none): both kinds in one document."""
    pdf = pdfium.PdfDocument(text_pdf([typeset]))
    pdf.import_pages(pdfium.PdfDocument(scanned_pdf([scanned])))
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def pages_pdf(media_boxes: list[bytes]) -> bytes:
    """Blank pages of the given MediaBoxes, in order (e.g. ``b"[0 0 14400 14400]"``: a page too large to render)."""
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(len(media_boxes)))
    pages = [b"<< /Type /Page /Parent 2 0 R /MediaBox %s >>" % box for box in media_boxes]
    return build_pdf([b"<< /Type /Catalog /Pages 2 0 R >>",
                      b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(media_boxes)), *pages])
