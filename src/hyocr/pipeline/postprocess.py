"""Turn raw HunyuanOCR output into structure: boxes, trimmed loops, JSON fields, markdown.

Everything here is a pure function of its inputs (LoopGuard only of what it was fed) and never trusts
the model: malformed output degrades to text, it does not raise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from hyocr.types import TextBlock

from .fields import extract_json

__all__ = [
    "LoopGuard",
    "markdown_from_document",
    "normalized_box_to_pixels",
    "parse_spotting",
    "to_spotting_text",
    "trim_repetition",
]

LOOP_MIN_SPAN = 200  # chars a repeating tail must cover before the streaming guard stops it
GRID = 1000  # HunyuanOCR boxes are normalised to 0..1000 of the image width/height

_NUM = r"\d+(?:\.\d+)?"
# One box: "(x1,y1),(x2,y2)". Anchoring on this pattern (not on "[^()]+") lets the text hold parentheses.
_PAIR = re.compile(rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)\s*,\s*\(\s*({_NUM})\s*,\s*({_NUM})\s*\)")
_STRAY_TAG = re.compile(r"</?(?:ref|quad|box)>")
_SPACES = re.compile(r"\s*")
_ANY_NUM = re.compile(r"-?\d+(?:\.\d+)?")


# ---- spotting ------------------------------------------------------------------------------------


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


# ---- repetition loops ----------------------------------------------------------------------------


def _periodic(text: str, n: int, unit: int, span: int) -> bool:
    """Do the last ``span`` chars repeat with period ``unit``? One C-level comparison."""
    return text[n - span : n - unit] == text[n - span + unit : n]


def _needed_span(unit: int, min_repeats: int, min_span: int) -> int:
    return max(min_repeats * unit, -(-min_span // unit) * unit)


def _tail_loop(
    text: str, min_repeats: int, max_unit: int, min_span: int, *, exact: bool
) -> tuple[int, int] | None:
    """The (unit length, repeating span) of the tail loop, or None.

    With ``exact`` the longest span wins (smallest unit on ties), found by binary search over the
    span, so each unit costs O(log n) C-level slice comparisons; multiples of a unit already found are
    skipped when they cannot extend it. Without ``exact`` the first unit that qualifies is returned.
    """
    n = len(text)
    min_repeats = max(2, min_repeats)
    best: tuple[int, int] | None = None
    found: list[tuple[int, int]] = []
    for unit in range(1, max(1, max_unit) + 1):
        need = _needed_span(unit, min_repeats, min_span)
        if need > n:
            if unit * min_repeats > n:
                break
            continue
        if any(unit % p == 0 and unit <= s for p, s in found):
            continue
        if not _periodic(text, n, unit, need):
            continue
        if not exact:
            return unit, need
        lo, hi = need, n + 1  # periodic at lo; hi is past the end (periodicity is monotone in the span)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _periodic(text, n, unit, mid) else (lo, mid)
        found.append((unit, lo))
        if best is None or lo > best[1]:
            best = (unit, lo)
    return best


def trim_repetition(
    text: str, *, min_length: int = 0, min_repeats: int = 10, max_unit: int = 200, min_span: int = 0
) -> tuple[str, bool]:
    """Cut a looping tail down to its first occurrence: ``(trimmed, True)``, else ``(text, False)``.

    A loop is a unit of 1..max_unit chars repeated back to back >= min_repeats times at the end, whose
    repeats also cover >= min_span chars (0 = the official HunyuanOCR rule). The result is always a prefix
    of ``text``: everything before the loop plus one whole unit, so a half-written last repeat is dropped.
    """
    if len(text) < max(min_length, 1):
        return text, False
    loop = _tail_loop(text, min_repeats, max_unit, min_span, exact=True)
    if loop is None:
        return text, False
    unit, span = loop
    start = len(text) - span
    return text[: start + _unit_phase(text, start, unit) + unit], True


_SENTENCE_END = frozenset("。．.!！?？;；")


def _unit_phase(text: str, start: int, unit: int) -> int:
    """Where in the loop a unit most plausibly begins (0..unit-1 chars after ``start``).

    The periodic span often reaches a few chars before the real loop (the text before a repeated
    sentence also ends in "。"), so cutting at ``start + unit`` would drop the unit's own last char.
    Prefer a unit that starts after a line break, then after sentence punctuation (optionally followed
    by a space); otherwise keep the span's own start.
    """
    best, best_rank = 0, 0
    for phase in range(unit if unit > 1 else 0):
        at = text[start + phase]
        if at.isspace() or at in _SENTENCE_END:
            continue
        before, before2 = text[start + phase - 1 + unit], text[start + phase - 2 + unit]
        if before == "\n":
            rank = 3
        elif before in _SENTENCE_END or (before.isspace() and before2 in _SENTENCE_END):
            rank = 2
        else:
            rank = 0
        if rank > best_rank:
            best, best_rank = phase, rank
    return best


class LoopGuard:
    """Streaming loop detector: feed deltas, stop generating when ``feed`` returns True.

    Rule: the tail is a loop when a unit of 1..max_unit chars repeats back to back at least
    ``min_repeats`` times AND the repeats span at least ``min_span`` chars. The span rule makes short
    units need more repeats (a 1-char unit needs 200 by default), because runs like ``----------`` or
    ``0000000000`` are legitimate in forms and tables while a 200-char run is not. Checks run only after
    ``check_after`` chars and then every ``check_every`` new chars, on a bounded tail window, so the cost
    per call stays small however long the output grows. Once triggered it stays triggered.
    """

    def __init__(
        self,
        min_repeats: int = 10,
        max_unit: int = 200,
        check_after: int = 256,
        check_every: int = 64,
        min_span: int = LOOP_MIN_SPAN,
    ) -> None:
        self.min_repeats = max(2, min_repeats)
        self.max_unit = max(1, max_unit)
        self.check_after = max(0, check_after)
        self.check_every = max(1, check_every)
        self.min_span = max(0, min_span)
        self._window = max(self.min_repeats * self.max_unit, self.min_span + self.max_unit)
        self._parts: list[str] = []
        self._pending: list[str] = []
        self._length = 0
        self._unchecked = 0
        self._tail = ""
        self._text_cache: str | None = ""
        self._triggered = False

    @property
    def text(self) -> str:
        if self._text_cache is None:
            self._text_cache = "".join(self._parts)
        return self._text_cache

    @property
    def triggered(self) -> bool:
        return self._triggered

    def feed(self, delta: str) -> bool:
        """Add new output; True when the accumulated tail is looping."""
        if delta:
            self._parts.append(delta)
            self._pending.append(delta)
            self._length += len(delta)
            self._unchecked += len(delta)
            self._text_cache = None
        if self._triggered:
            return True
        if self._length < self.check_after or self._unchecked < self.check_every:
            return False
        self._unchecked = 0
        self._tail = (self._tail + "".join(self._pending))[-self._window :]
        self._pending.clear()
        loop = _tail_loop(self._tail, self.min_repeats, self.max_unit, self.min_span, exact=False)
        self._triggered = loop is not None
        return self._triggered

    def trimmed_text(self) -> str:
        """The text with the detected loop cut to one unit (unchanged when no loop was detected)."""
        if not self._triggered:
            return self.text
        trimmed, _ = trim_repetition(
            self.text, min_repeats=self.min_repeats, max_unit=self.max_unit, min_span=self.min_span
        )
        return trimmed


def markdown_from_document(text: str) -> str:
    """Remove a ```markdown fence wrapping the whole output; fences inside the document stay."""
    body = text.strip()
    m = re.match(r"```[ \t]*([A-Za-z]*)[ \t]*\n", body)
    if not m:
        return text
    tag = m.group(1).lower()
    inner = body[m.end() :]
    if inner.rstrip().endswith("```"):
        inner = inner.rstrip()[:-3]
    if tag in ("markdown", "md") or (tag == "" and "```" not in inner):
        return inner.strip("\n")
    return text
