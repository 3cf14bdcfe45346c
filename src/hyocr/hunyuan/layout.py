"""HunyuanOCR 1.5's layout analysis (task ``layout``) -> blocks with a category and a box in pixels.

The prompt's answer format is not documented; the authors' reward parser for layout accepts two, so both are
read: ``text<hy-meta><layout>category</layout><poly>(x1,y1),...,(x4,y4)</poly></hy-meta>`` (or ``<quad>``)
and a JSON array of ``{"layout_type", "bbox", "text"}`` whose bbox is a coordinate string or a list of points.
Coordinates are on the 0-1000 grid, as in spotting. Text that fits neither stays one block without a box.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from ..types import TextBlock
from .spotting import _ANY_NUM, _block_from_numbers

__all__ = ["parse_layout"]

# Found by its tag only (the text before it is what lies between matches): a scan from every position for
# a leading text group would be quadratic on long output without tags.
_HY_META = re.compile(r"<hy-meta>\s*<layout>([^<]+)</layout>\s*<(poly|quad)>([^<]+)</\2>\s*</hy-meta>")
# The authors' category names, normalised (their scorer's aliases)
_ALIASES = {"chart_title": "figure_title", "chart": "figure", "title": "section_title", "heading": "section_title",
            "page_header": "header", "page_footer": "footer"}


def _category(name: str) -> str:
    key = name.strip().lower().replace(" ", "_").replace("-", "_")
    return _ALIASES.get(key, key)


def _block(text: str, category: str, coords: object, width: int, height: int) -> TextBlock:
    numbers = [float(n) for n in _ANY_NUM.findall(coords)] if isinstance(coords, str) else coords
    block = (_block_from_numbers(text, numbers, width, height) if isinstance(numbers, list)
             else TextBlock(text=text))
    return replace(block, category=_category(category))


def _from_json(body: str, width: int, height: int) -> list[TextBlock] | None:
    try:
        value = json.loads(body.strip().removeprefix("```json").removesuffix("```").strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list):
        return None
    blocks = []
    for item in value:
        if isinstance(item, dict) and ("layout_type" in item or "category" in item):
            label = str(item.get("layout_type") or item.get("category") or "")
            text = item.get("text") if isinstance(item.get("text"), str) else ""
            blocks.append(_block(text.strip(), label, item.get("bbox") or item.get("box"), width, height))
    return blocks or None


def parse_layout(text: str, width: int, height: int) -> list[TextBlock]:
    """Layout output -> blocks in reading order, each with its ``category``; never raises on bad text."""
    if not isinstance(text, str) or not text.strip():
        return []
    if text.lstrip().startswith(("[", "```")):
        parsed = _from_json(text, width, height)
        if parsed is not None:
            return parsed
    blocks: list[TextBlock] = []
    end = 0
    for m in _HY_META.finditer(text):
        blocks.append(_block(text[end:m.start()].strip(), m.group(1), m.group(3), width, height))
        end = m.end()
    tail = text[end:].strip()
    if tail:
        blocks.append(TextBlock(text=tail))
    return blocks
