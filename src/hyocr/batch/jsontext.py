"""Text of file names that may not be UTF-8 (PEP 383: ``scan\\udcff.png`` for the bytes ``scan\\xff.png``):
such a str opens the right file, but ``str.encode()`` refuses it. JSON of them: ``jobs.codec.json_text``.
"""

from __future__ import annotations


def utf8(text: str) -> bytes:
    """``text`` as bytes for a hash: UTF-8, a lone surrogate as its code point (the same bytes as before
    for every other str)."""
    return text.encode("utf-8", "surrogatepass")


def readable(text: str) -> str:
    """``text`` for a table column or a line shown to a person: a byte that was not UTF-8 as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
