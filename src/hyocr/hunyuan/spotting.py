"""HunyuanOCR's spotting output format and its 0..1000 coordinate grid.

Parsing never trusts the model: malformed output degrades to text, it does not raise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from ..types import TextBlock
from .extraction import extract_json
from .markdown import markdown_from_document

__all__ = ["GRID", "normalized_box_to_pixels", "parse_spotting", "to_spotting_text"]

GRID = 1000  # HunyuanOCR boxes are normalised to 0..1000 of the image width/height

_NUM = r"\d+(?:\.\d+)?"
# One box: "(x1,y1),(x2,y2)". Anchoring on this pattern (not on "[^()]+") lets the text hold parentheses.
_PAIR = re.compile(rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*,\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_STRAY_TAG = re.compile(r"</?(?:ref|quad|box)>")
_SPACES = re.compile(r"\s*")
_ANY_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def _clamp(value: float, low: float, high: float) -> float:
    return low if value < low else min(value, high)


def _to_px(value: float, size: int) -> float:
    """One 0..1000 grid coordinate -> pixels, clamped to the image and rounded to 2 decimals."""
    return round(_clamp(value * size / GRID, 0.0, float(size)), 2)


def _finite(values: Iterable[Any]) -> list[float] | None:
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError, OverflowError):
        return None
    return out if all(math.isfinite(v) for v in out) else None


def normalized_box_to_pixels(
    box: Sequence[float], width: int, height: int
) -> tuple[float, float, float, float]:
    """[x1, y1, x2, y2] on the 0..1000 grid -> pixels of a ``width`` x ``height`` image.

    Corners are re-ordered (x1 <= x2, y1 <= y2) and clamped to the image, because the model sometimes
    emits swapped corners or values a little past 1000. Rounded to 2 decimals to keep output stable.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if len(box) != 4:
        raise ValueError(f"a box needs 4 numbers, got {len(box)}")
    x1, y1, x2, y2 = (float(v) for v in box)
    xs = sorted((_to_px(x1, width), _to_px(x2, width)))
    ys = sorted((_to_px(y1, height), _to_px(y2, height)))
    return (xs[0], ys[0], xs[1], ys[1])


def _block_from_numbers(text: str, numbers: Sequence[Any], width: int, height: int) -> TextBlock:
    """4 numbers are a box, 8 (or 4 points) a quad; anything else keeps the text without a box."""
    flat: list[Any] = []
    for n in numbers:
        flat.extend(n if isinstance(n, (list, tuple)) else (n,))
    values = _finite(flat)
    if values is None or len(values) not in (4, 8):
        return TextBlock(text=text)
    if len(values) == 4:
        return TextBlock(text=text, box=normalized_box_to_pixels(values, width, height))
    points = [(_to_px(x, width), _to_px(y, height)) for x, y in zip(values[0::2], values[1::2], strict=True)]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    return TextBlock(text=text, box=(min(xs), min(ys), max(xs), max(ys)), polygon=tuple(points))


def _parse_plain(text: str, width: int, height: int) -> list[TextBlock]:
    """The 1.0 format: ``text(x1,y1),(x2,y2)text2(x1,y1),(x2,y2)``, any separators between items."""
    blocks: list[TextBlock] = []
    start = 0
    for m in _PAIR.finditer(text):
        nxt = _PAIR.match(text, m.end())
        if nxt is not None:
            # Two boxes back to back: the first belongs to the text ("Item (1,2),(3,4)" + its own box).
            continue
        item = text[start : m.start()].strip()
        start = m.end()
        if item:
            blocks.append(
                TextBlock(
                    text=item, box=normalized_box_to_pixels([float(g) for g in m.groups()], width, height)
                )
            )
    tail = text[start:].strip()
    if tail:
        blocks.append(TextBlock(text=tail))
    return blocks


def _parse_json_items(value: Any, width: int, height: int) -> list[TextBlock] | None:
    """The 1.5 ``spotting_json`` array (or one inside a wrapper object); None when it is not one."""
    if isinstance(value, dict):
        value = next((v for v in value.values() if isinstance(v, list)), None)
    if not isinstance(value, list) or not any(isinstance(i, dict) and "text" in i for i in value):
        return None
    blocks: list[TextBlock] = []
    for item in value:
        if not isinstance(item, dict):
            continue
        text = item.get("text")
        text = text.strip() if isinstance(text, str) else ""
        if not text:
            continue
        box = next((item[k] for k in ("box", "bbox", "quad", "polygon", "points") if k in item), None)
        if isinstance(box, (list, tuple)):
            blocks.append(_block_from_numbers(text, box, width, height))
        else:
            blocks.append(TextBlock(text=text))
    return blocks


def parse_spotting(text: str, width: int, height: int) -> list[TextBlock]:
    """Spotting output -> pixel-space blocks, in output order.

    Accepts the 1.0 run format, ``<ref>..</ref><quad|box>..</quad|box>`` and the 1.5 JSON array.
    Nothing is silently lost: text without coordinates becomes a block whose box is None.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if not isinstance(text, str) or not text.strip():
        return []
    body = text.strip()
    if body.startswith(("[", "{", "```")):
        blocks = _parse_json_items(extract_json(body)[0], width, height)
        if blocks is not None:
            return blocks
        body = markdown_from_document(body)
    return _parse_tagged(body, width, height)


def _parse_tagged(body: str, width: int, height: int) -> list[TextBlock]:
    """``<ref>text</ref><quad|box>coords</quad|box>`` items; text between them goes to the 1.0 parser.

    A plain scan with str.find rather than a lazy regex: unclosed tags in a long output would make
    the regex quadratic.
    """
    blocks: list[TextBlock] = []
    unclosed: set[str] = set()  # closing tags known to be absent from here on
    pos = 0
    while (i := body.find("<ref>", pos)) >= 0 and (j := body.find("</ref>", i + 5)) >= 0:
        blocks.extend(_parse_plain(_STRAY_TAG.sub("\n", body[pos:i]), width, height))
        item = _STRAY_TAG.sub(" ", body[i + 5 : j]).strip()
        pos = j + 6
        k = _SPACES.match(body, pos).end()  # type: ignore[union-attr]  # \s* always matches
        coords = None
        for tag in ("quad", "box"):
            if body.startswith(f"<{tag}>", k) and tag not in unclosed:
                end = body.find(f"</{tag}>", k)
                if end < 0:
                    unclosed.add(tag)
                    break
                coords, pos = body[k + len(tag) + 2 : end], end + len(tag) + 3
                break
        if item:
            nums = _ANY_NUM.findall(coords) if coords is not None else None
            blocks.append(_block_from_numbers(item, nums, width, height) if nums else TextBlock(item))
    blocks.extend(_parse_plain(_STRAY_TAG.sub("\n", body[pos:]), width, height))
    return blocks


def to_spotting_text(blocks: Iterable[TextBlock], width: int, height: int) -> str:
    """Render pixel-space blocks in the 1.0 format so chat clients see what HunyuanOCR would emit.

    Box-less blocks are written as their text plus a newline; they round-trip only as text.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")

    def grid(v: float, size: int) -> int:
        return int(_clamp(round(v * GRID / size), 0, GRID))

    parts: list[str] = []
    for block in blocks:
        text = block.text.strip()
        if not text:
            continue
        if block.box is None:
            parts.append(text + "\n")
            continue
        x1, y1, x2, y2 = block.box
        gx = sorted((grid(x1, width), grid(x2, width)))
        gy = sorted((grid(y1, height), grid(y2, height)))
        parts.append(f"{text}({gx[0]},{gy[0]}),({gx[1]},{gy[1]})")
    return "".join(parts)
