"""A document's pages read so far: ``DIR/.hyocr-pages/<output>l``, JSON lines appended as each page finishes
(flushed and synced), so a run that stops mid-document (Ctrl-C, a kill, a failed range) leaves its pages,
and the next attempt or run reads only the pages missing. Lines name the content and options they were
read with; a document changed since starts afresh. The file goes once the document's output is written.

Apart from the state file on purpose: that file's lines are the documents' outcomes, the same whichever
path (in-process, Ray) read them; these are one path's work in progress.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from ..jobs.codec import json_text, page_from_json, page_to_json
from ..types import PageResult

PARTS_DIR = ".hyocr-pages"


def parts_path(out_dir: Path, output: str) -> Path:
    return out_dir / PARTS_DIR / f"{output}l"  # name.json -> name.jsonl


class Partial:
    """The pages (by 0-based page index) and the timings of the reads finished, for one content and options."""

    def __init__(self, out_dir: Path, output: str, sha256: str, options: str) -> None:
        self.path = parts_path(out_dir, output)
        self.tag = {"sha256": sha256, "options": options}
        self.pages: dict[int, PageResult] = {}
        self.timings: dict[str, float] = {}
        stale = False
        with contextlib.suppress(FileNotFoundError), self.path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    if {k: entry.get(k) for k in self.tag} != self.tag:
                        stale = True
                    elif "page" in entry:
                        page = page_from_json(entry["page"])
                        self.pages[page.index] = page
                    elif "timings" in entry:
                        self._add_timings(entry["timings"])
                except (ValueError, TypeError, KeyError, AttributeError):  # a torn last line
                    continue
        if stale:  # another content or options: its pages are not this document's
            self.pages, self.timings = {}, {}
            discard(self.path)

    def add_page(self, page: PageResult) -> None:
        self.pages[page.index] = page
        self._append({"page": page_to_json(page)})

    def add_timings(self, timings: dict[str, float | None]) -> None:
        """A read's timings (each stage's milliseconds): the document's are the sum of its reads'."""
        self._add_timings(timings)
        self._append({"timings": timings})

    def _add_timings(self, timings: dict[str, float | None]) -> None:
        for stage, ms in timings.items():
            if isinstance(ms, int | float):
                self.timings[stage] = round(self.timings.get(stage, 0.0) + ms, 2)

    def _append(self, entry: dict) -> None:
        self.path.parent.mkdir(exist_ok=True)
        with self.path.open("ab") as f:
            f.write(json_text({**self.tag, **entry}).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())


def discard(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
