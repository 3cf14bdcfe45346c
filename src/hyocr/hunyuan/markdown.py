"""HunyuanOCR's document output: Markdown, sometimes wrapped whole in a ```markdown fence."""

from __future__ import annotations

import re

__all__ = ["markdown_from_document"]


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
