"""Which pages of a PDF a batch reads, and in what ranges.

``--pages`` on the command line is one selection for documents of many lengths: over a folder, ``1-3``
means "the first three pages", so a shorter document is read for the pages it has, with a note saying so
(``select(..., clamp=True)``). A manifest line's ``pages`` names that document's own pages: a page past
its end is an error, as in ``hyocr ocr``. A selection that is malformed (``5-3``, ``x``) is refused before
anything runs (``check``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from ..pipeline.pdf_worker import parse_pages

_NUMBER = re.compile(r"\d+", re.ASCII)


def check(spec: str | None) -> None:
    """Raises InvalidRequest when ``spec`` is not a selection of pages, whatever the document."""
    from ..errors import InvalidRequest

    if spec is None:
        return
    # Past every page the selection names, only its form can be wrong; a limit of 0 stops parse_pages once
    # every part is checked, before it lists any page ("1-1000000000" is a valid selection).
    try:
        parse_pages(spec, max(map(int, _NUMBER.findall(spec)), default=0) + 1, 0)
    except InvalidRequest as exc:
        if exc.code != "too_many_pages":
            raise


def select(spec: str | None, count: int, max_pages: int, *, clamp: bool) -> tuple[list[int], str | None]:
    """(0-based pages to read, in page order; a note when ``clamp`` cut the selection to the document).
    Raises InvalidRequest: a page past the end (without ``clamp``), nothing left, more than ``max_pages``."""
    from ..errors import InvalidRequest

    if spec is None or not clamp or spec.strip().lower() in ("", "all"):
        return list(parse_pages(spec, count, max_pages)), None
    check(spec)
    kept, cut = [], False
    for part in spec.split(","):
        first, *rest = map(int, _NUMBER.findall(part))
        last = rest[0] if rest else count if "-" in part else first
        cut |= last > count
        if first <= count:
            kept.append(f"{first}-{min(last, count)}")
    has = f"the document has {count} page{'s' if count != 1 else ''}"
    if not kept:
        raise InvalidRequest(f"--pages {spec}: {has}", param="pages", code="invalid_pages")
    pages = list(parse_pages(",".join(kept), count, max_pages))
    return pages, f"--pages {spec}: {has}; read {spec_of(pages)}" if cut else None


def spec_of(pages: Sequence[int]) -> str:
    """0-based pages in order -> the 1-based selection that names them: [0, 1, 2, 7] -> "1-3,8"."""
    parts: list[str] = []
    for first, last in _runs(pages):
        parts.append(str(first + 1) if first == last else f"{first + 1}-{last + 1}")
    return ",".join(parts)


def _runs(pages: Sequence[int]) -> Iterator[tuple[int, int]]:
    start = prev = None
    for page in pages:
        if prev is not None and page == prev + 1:
            prev = page
            continue
        if start is not None:
            yield start, prev
        start = prev = page
    if start is not None:
        yield start, prev


def ranges(pages: Sequence[int], size: int) -> Iterator[list[int]]:
    """``pages`` cut into reads of at most ``size`` pages, in order."""
    for i in range(0, len(pages), size):
        yield list(pages[i:i + size])
