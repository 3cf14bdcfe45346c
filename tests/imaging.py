"""Real test inputs: text rendered into images at test time, with the boxes where it was drawn."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

LATIN_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
CJK_FONT = Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")


def font(size: int, *, cjk: bool = False) -> ImageFont.FreeTypeFont:
    path = CJK_FONT if cjk else LATIN_FONT
    if not path.exists():
        raise RuntimeError(
            f"test font {path} is missing: install fonts-dejavu-core and fonts-wqy-microhei (see .ci/run)"
        )
    return ImageFont.truetype(str(path), size)


@dataclass(frozen=True)
class Line:
    text: str
    xy: tuple[int, int]
    size: int = 36
    cjk: bool = False


@dataclass(frozen=True)
class Rendered:
    image: Image.Image
    lines: tuple[Line, ...]
    boxes: tuple[tuple[int, int, int, int], ...]  # drawn text bounds per line, pixels

    def png(self) -> bytes:
        return to_bytes(self.image, "PNG")


def render(lines: list[Line], size: tuple[int, int] = (1024, 640), background: str = "white") -> Rendered:
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    boxes = []
    for line in lines:
        f = font(line.size, cjk=line.cjk)
        draw.text(line.xy, line.text, fill="black", font=f)
        boxes.append(tuple(int(v) for v in draw.textbbox(line.xy, line.text, font=f)))
    return Rendered(image, tuple(lines), tuple(boxes))


def to_bytes(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


CARD_LINES = [
    Line("IDENTITY CARD", (60, 50), 48),
    Line("NAME: JOHN SMITH", (60, 170)),
    Line("ID No. 4201 0619 8805", (60, 260)),
    Line("BORN 1988-05-06", (60, 350)),
    Line("EXPIRES 2031-12-31", (60, 440)),
]

CHINESE_LINES = [
    Line("姓名 张三", (60, 60), 48, cjk=True),
    Line("住址 北京市海淀区", (60, 180), 48, cjk=True),
    Line("发票金额 128.50 元", (60, 300), 48, cjk=True),
]


def card() -> Rendered:
    return render(CARD_LINES)


def chinese_card() -> Rendered:
    return render(CHINESE_LINES, size=(900, 420))


def overlap(a, b) -> float:
    """Intersection over the smaller box: 1.0 when one box sits inside the other."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return ix * iy / smaller if smaller > 0 else 0.0


def squash(text: str) -> str:
    """Compare OCR text without spacing differences."""
    return "".join(text.split()).upper()
