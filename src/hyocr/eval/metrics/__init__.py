"""Scores of one page against its reference, one family a file: ``text`` (CER, WER, normalised edit distance,
bag of words), ``boxes`` (spotting: boxes matched at IoU >= 0.5), ``fields`` (extraction), ``tables`` (TEDS),
``markdown`` (a page split into text, formulas and tables, as OmniDocBench does). Pure functions; their
libraries (extra ``eval``: rapidfuzz, apted, lxml) are imported when a score needs them."""

from __future__ import annotations

import importlib.util

from .. import EvalError

LIBRARIES = ("rapidfuzz", "apted", "lxml")
INSTALL_HINT = "hyocr eval needs its metric libraries: pip install 'hyocr[eval]' (rapidfuzz, apted, lxml)"


def require() -> None:
    """Checked before anything is read, so a missing extra does not cost a finished run."""
    missing = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
    if missing:
        raise EvalError(f"{INSTALL_HINT}; missing: {', '.join(missing)}")
