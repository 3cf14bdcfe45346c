"""hyocr's post-processing policy for raw model output: the repetition-loop guard and trimming.

Everything here is a pure function of its inputs (LoopGuard only of what it was fed). The model's own
output formats (spotting boxes, lenient JSON, the markdown fence) are parsed in hyocr.hunyuan.
"""

from __future__ import annotations

__all__ = ["LoopGuard", "trim_repetition"]

LOOP_MIN_SPAN = 200  # chars a repeating tail must cover before the streaming guard stops it

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
