"""JSON text for hyocr batch's files that always encodes to UTF-8.

A file name that is not UTF-8 reaches Python as a str with lone surrogates (PEP 383: ``scan\\udcff.png``
for the bytes ``scan\\xff.png``); it opens the right file, but ``str.encode()`` refuses it. Paths are in
the state file, the summary, partial results and the outputs: written with ``ensure_ascii=False`` (so
Chinese stays readable), and only where such a name is present with ``\\u`` escapes, which ``json.loads``
reads back to the same str, so the document is found again on a rerun.
"""

from __future__ import annotations

import json
from typing import Any


def dumps(obj: Any, **kwargs: Any) -> str:
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, **kwargs)
    return text


def utf8(text: str) -> bytes:
    """``text`` as bytes for a hash: UTF-8, a lone surrogate as its code point (the same bytes as before
    for every other str)."""
    return text.encode("utf-8", "surrogatepass")


def readable(text: str) -> str:
    """``text`` for a table column or a line shown to a person: a byte that was not UTF-8 as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
