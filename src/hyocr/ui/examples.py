"""Example images for the UI, drawn at start-up (no binary files in the repository).

Fonts come from the system (DejaVu / Noto / Liberation for Latin, WenQuanYi / Noto CJK for Chinese).
Without a CJK font the Chinese text is left out rather than drawn as empty boxes; without any
font, Pillow's built-in one is used.
"""

from __future__ import annotations

import re
import uuid
from functools import cache
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

_FONT_DIRS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"), Path("/Library/Fonts"),
              Path("/System/Library/Fonts"), Path("C:/Windows/Fonts"))
_LATIN = ("DejaVuSans.ttf", "NotoSans-Regular.ttf", "LiberationSans-Regular.ttf", "Arial.ttf", "arial.ttf")
_LATIN_BOLD = ("DejaVuSans-Bold.ttf", "NotoSans-Bold.ttf", "LiberationSans-Bold.ttf", "Arial Bold.ttf")
_CJK = ("wqy-microhei.ttc", "wqy-zenhei.ttc", "NotoSansCJK-Regular.ttc", "NotoSansSC-Regular.otf",
        "DroidSansFallbackFull.ttf", "PingFang.ttc", "msyh.ttc", "simhei.ttf")

_CJK_RUN = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]+")

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


@cache
def find_font(names: tuple[str, ...]) -> Path | None:
    """The first of ``names`` installed under a usual font folder (searched once per name list)."""
    for folder in _FONT_DIRS:
        if not folder.is_dir():
            continue
        for name in names:
            found = next(folder.rglob(name), None)
            if found is not None:
                return found
    return None


def font(size: int, *, cjk: bool = False, bold: bool = False) -> Font | None:
    """A font of ``size`` px; None when ``cjk`` is asked for and no CJK font is installed."""
    path = find_font(_CJK) if cjk else (find_font(_LATIN_BOLD) if bold else None) or find_font(_LATIN)
    if path is not None:
        return ImageFont.truetype(str(path), size)
    return None if cjk else ImageFont.load_default(size=size)


def _text(draw: ImageDraw.ImageDraw, xy: tuple[int, int], text: str, size: int, *,
          cjk: bool = False, bold: bool = False, fill: str = "#111827") -> None:
    f = font(size, cjk=cjk, bold=bold)
    if f is None:  # no CJK font: keep the Latin part of the line
        text, f = " ".join(_CJK_RUN.sub(" ", text).split()), font(size, bold=bold)
    if text:
        draw.text(xy, text, fill=fill, font=f)


def id_card() -> Image.Image:
    """A bilingual identity card: short labelled fields, the case spotting and extraction are for."""
    img = Image.new("RGB", (960, 600), "#eef2f7")
    d = ImageDraw.Draw(img)
    d.rounded_rectangle((20, 20, 940, 580), radius=28, fill="#fbfcfe", outline="#94a3b8", width=3)
    d.rounded_rectangle((20, 20, 940, 120), radius=28, fill="#1e3a8a")
    d.rectangle((20, 90, 940, 120), fill="#1e3a8a")
    _text(d, (60, 42), "IDENTITY CARD", 44, bold=True, fill="white")
    _text(d, (560, 46), "居民身份证", 40, cjk=True, fill="white")
    d.rounded_rectangle((680, 170, 880, 410), radius=12, fill="#dbe3ee", outline="#94a3b8", width=2)
    d.ellipse((740, 205, 820, 285), fill="#9aa9bd")
    d.pieslice((705, 290, 855, 470), 180, 360, fill="#9aa9bd")
    rows = [("NAME", "JOHN SMITH", "姓名 张伟"), ("ID No.", "4201 0619 8805", None),
            ("BORN", "1988-05-06", "出生 1988年5月6日"), ("EXPIRES", "2031-12-31", None)]
    y = 160
    for label, value, chinese in rows:
        _text(d, (60, y), label, 24, fill="#475569")
        _text(d, (230, y - 6), value, 36, bold=True)
        if chinese:
            _text(d, (230, y + 40), chinese, 28, cjk=True, fill="#334155")
        y += 100 if chinese else 72
    _text(d, (60, 530), "ADDRESS 住址: 88 Harbour Road, 上海市浦东新区", 24, cjk=True, fill="#334155")
    return img


def invoice() -> Image.Image:
    """A small bilingual invoice with a ruled table: the case document and table parsing are for."""
    img = Image.new("RGB", (900, 680), "white")
    d = ImageDraw.Draw(img)
    _text(d, (60, 50), "INVOICE", 46, bold=True)
    _text(d, (300, 56), "发票", 40, cjk=True)
    _text(d, (60, 125), "No. 2025-0147      Date 2025-03-18", 26, fill="#374151")
    _text(d, (60, 165), "Seller 销售方: Blue River Tea Co. 蓝河茶业", 26, cjk=True, fill="#374151")
    cols = (60, 430, 590, 840)
    rows = [("Item 品名", "Qty 数量", "Amount 金额"), ("Green tea 绿茶", "2", "36.00"),
            ("Oolong 乌龙茶", "1", "48.50"), ("Tea cups 茶杯", "4", "44.00")]
    top, height = 230, 62
    for i, row in enumerate(rows):
        y = top + i * height
        if i == 0:
            d.rectangle((cols[0], y, cols[-1], y + height), fill="#e5e7eb")
        for j, cell in enumerate(row):
            _text(d, (cols[j] + 16, y + 16), cell, 26, cjk=True)
    bottom = top + len(rows) * height
    for i in range(len(rows) + 1):
        d.line((cols[0], top + i * height, cols[-1], top + i * height), fill="#6b7280", width=2)
    for x in cols:
        d.line((x, top, x, bottom), fill="#6b7280", width=2)
    _text(d, (430, bottom + 40), "TOTAL 合计  128.50", 34, cjk=True, bold=True)
    _text(d, (60, bottom + 130), "Thank you for your purchase. 谢谢惠顾！", 26, cjk=True, fill="#374151")
    return img


def write_examples(folder: Path) -> dict[str, Path]:
    """Draw the examples into ``folder``; name -> PNG path.

    Each call's files differ by a random PNG text chunk: Gradio caches files by content hash in one
    folder per machine and deletes what an app cached when that app stops, so identical examples
    of two servers (or two apps in one process) would vanish from under each other.
    """
    folder.mkdir(parents=True, exist_ok=True)
    info = PngInfo()
    info.add_text("hyocr-instance", uuid.uuid4().hex)
    out = {}
    for name, draw in (("id-card", id_card), ("invoice", invoice)):
        path = folder / f"{name}.png"
        draw().save(path, pnginfo=info)
        out[name] = path
    return out
