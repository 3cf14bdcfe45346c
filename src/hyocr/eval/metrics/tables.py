"""Tables: TEDS (tree-edit-distance similarity, PubTabNet's metric, which OmniDocBench and docling-eval use)
and TEDS-S (structure only).

A table is parsed with lxml's HTML parser into a tree of ``table`` -> ``tr`` -> ``td`` (``th`` read as
``td``; ``thead``/``tbody``/``tfoot`` unwrapped). The tree edit distance (APTED, the ``apted`` package)
costs 1 to insert or delete a node; renaming costs 1 between different tags or spans (colspan, rowspan), and
between two cells the normalised Levenshtein distance of their texts (0 for TEDS-S). Then
TEDS = 1 - distance / max(nodes of either tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .text import distance, normalize


@dataclass(slots=True)
class Node:
    tag: str
    colspan: int = 1
    rowspan: int = 1
    text: str = ""
    children: list[Node] = field(default_factory=list)

    def size(self) -> int:
        return 1 + sum(child.size() for child in self.children)


def _span(cell, name: str) -> int:
    try:
        return max(1, int(cell.get(name, "1")))
    except ValueError:
        return 1


def parse_table(html: str) -> Node | None:
    """The first ``<table>`` of ``html`` as a tree; None when there is none."""
    import lxml.etree
    import lxml.html

    try:
        root = lxml.html.fragment_fromstring(html, create_parent="div")
    except (lxml.etree.ParserError, ValueError):
        return None
    table = root.find(".//table")
    if table is None:
        return None
    tree = Node("table")
    for row in table.iter("tr"):
        if next((a for a in row.iterancestors("table")), None) is not table:
            continue  # a row of a table nested in a cell belongs to that cell's text
        cells = [Node("td", _span(c, "colspan"), _span(c, "rowspan"), normalize(c.text_content()))
                 for c in row if c.tag in ("td", "th")]
        tree.children.append(Node("tr", children=cells))
    return tree


def _config(structure_only: bool):
    from apted import Config

    class TableConfig(Config):
        valuecls = float

        def rename(self, a: Node, b: Node) -> float:
            if a.tag != b.tag or a.colspan != b.colspan or a.rowspan != b.rowspan:
                return 1.0
            if a.tag != "td" or structure_only:
                return 0.0
            longest = max(len(a.text), len(b.text))
            return distance(a.text, b.text) / longest if longest else 0.0

        def children(self, node: Node) -> list[Node]:
            return node.children

    return TableConfig()


def teds(output: Node | None, reference: Node, *, structure_only: bool = False) -> float:
    """TEDS of an output table against the reference (0.0 when the output has no table)."""
    from apted import APTED

    if output is None:
        return 0.0
    dist = APTED(output, reference, _config(structure_only)).compute_edit_distance()
    return 1.0 - dist / max(output.size(), reference.size())


def html_teds(output_html: str, reference_html: str, *, structure_only: bool = False) -> float:
    reference = parse_table(reference_html)
    if reference is None:
        raise ValueError("the reference holds no <table>")
    return teds(parse_table(output_html), reference, structure_only=structure_only)


def score_tables(reference: Sequence[str], output: Sequence[str]) -> list[tuple[float, float]]:
    """(TEDS, TEDS-S) for each reference table, paired with the output's tables greedily by TEDS (each output
    table used once); a reference table with no output table left scores 0. A reference without a <table>
    is skipped."""
    refs = [t for t in (parse_table(h) for h in reference) if t is not None]
    outs = [parse_table(h) for h in output]
    outs = [t for t in outs if t is not None]
    scores = sorted(((teds(o, r), i, j) for i, r in enumerate(refs) for j, o in enumerate(outs)),
                    key=lambda t: (-t[0], t[1], t[2]))
    paired: dict[int, tuple[int, float]] = {}
    used: set[int] = set()
    for value, i, j in scores:
        if i not in paired and j not in used:
            paired[i] = (j, value)
            used.add(j)
    result = []
    for i, ref in enumerate(refs):
        if i in paired:
            j, value = paired[i]
            result.append((value, teds(outs[j], ref, structure_only=True)))
        else:
            result.append((0.0, 0.0))
    return result
