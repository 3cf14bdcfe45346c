"""Document parsing: a page's markdown split the way OmniDocBench's ``md_tex_filter`` splits it, then each
part scored on its own: the text by NED (``text``), display formulas by NED of their LaTeX with whitespace
and case ignored, tables by TEDS (``tables``).

The split: images (``![..](..)``) dropped; HTML tables and markdown pipe tables (made HTML) taken out as
tables; ``$$..$$`` and ``\\[..\\]`` taken out as formulas; what remains is text, with markdown's own marks
(heading hashes, emphasis, HTML tags) removed. Unlike OmniDocBench's default ``quick_match``, the page is
scored whole (its ``no_split`` mode): paragraphs are not matched one by one, so text the reference leaves
out (OmniDocBench's set ignores headers, footers, page numbers and captions) counts against an output that
writes it. For leaderboard numbers run OmniDocBench's own scorer; these are for comparing settings.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from .text import distance

_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_HTML_TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL | re.IGNORECASE)
_FORMULA = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]", re.DOTALL)
_PIPE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_PIPE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_TAG = re.compile(r"<[^>]+>")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.MULTILINE)
_EMPHASIS = re.compile(r"(\*\*|__|\*|`)")
_FORMULA_NOISE = re.compile(r"\\tag\{[^}]*\}|\\(?:,|;|!|quad|qquad)|\s+")


@dataclass(slots=True)
class Parts:
    text: str
    formulas: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)  # HTML


def _pipe_tables(markdown: str, tables: list[str]) -> str:
    """Markdown pipe tables (a header row, a rule row, rows) -> HTML in ``tables``; their lines removed."""
    lines, out, i = markdown.split("\n"), [], 0
    while i < len(lines):
        if i + 1 < len(lines) and _PIPE_ROW.match(lines[i]) and _PIPE_RULE.match(lines[i + 1]):
            rows = [lines[i]]
            i += 2
            while i < len(lines) and _PIPE_ROW.match(lines[i]):
                rows.append(lines[i])
                i += 1
            cells = [[html.escape(c.strip()) for c in row.strip().strip("|").split("|")] for row in rows]
            tables.append("<table>" + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                                              for row in cells) + "</table>")
            out.append("")
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out)


def split(markdown: str) -> Parts:
    tables: list[str] = []
    formulas: list[str] = []
    content = _IMAGE.sub("", markdown)

    def take_table(m: re.Match) -> str:
        tables.append(m.group(0))
        return "\n\n"

    def take_formula(m: re.Match) -> str:
        formulas.append((m.group(1) if m.group(1) is not None else m.group(2)).strip())
        return "\n\n"

    content = _HTML_TABLE.sub(take_table, content)
    content = _pipe_tables(content, tables)
    content = _FORMULA.sub(take_formula, content)
    return Parts(plain(content), formulas, tables)


def plain(markdown: str) -> str:
    """Markdown (or HTML bits) as the text a reader sees: tags, heading hashes and emphasis marks removed,
    table cells and formulas kept as text."""
    text = _IMAGE.sub("", markdown)
    text = re.sub(r"</t[dh]>", " ", text, flags=re.IGNORECASE)
    text = re.sub(r"</tr>|<br\s*/?>", "\n", text, flags=re.IGNORECASE)
    text = html.unescape(_TAG.sub("", text))
    text = _HEADING.sub("", text)
    return _EMPHASIS.sub("", text.replace("$$", " ").replace("\\[", " ").replace("\\]", " "))


def formula_key(latex: str) -> str:
    """A formula as compared: spacing commands, \\tag{} and whitespace dropped, case folded."""
    return _FORMULA_NOISE.sub("", latex).casefold()


@dataclass(frozen=True, slots=True)
class FormulaScore:
    formulas: int  # reference formulas
    edits: int
    length: int  # the longer of the joined formula strings

    @property
    def ned(self) -> float:
        return self.edits / self.length if self.length else 0.0


def score_formulas(reference: list[str], output: list[str]) -> FormulaScore:
    """The page's display formulas, joined in order on each side, by NED (OmniDocBench pairs them one by
    one; whole-page joined is its no_split reading)."""
    want, got = "".join(map(formula_key, reference)), "".join(map(formula_key, output))
    return FormulaScore(len(reference), distance(want, got), max(len(want), len(got)))
