"""An OmniDocBench download read as it is: ``OmniDocBench.json`` (a list of pages, each with ``layout_dets``
and ``page_info``) beside ``images/`` (and ``pdfs/``, the same pages as PDFs).

Each page becomes a sample whose truth is built from its annotated blocks, skipping those marked
``ignore`` and the ``abandon`` category, in reading order (``order``; OmniDocBench reads a missing order as
0), blocks of a ``truncated`` relation joined as one (as its loader does):

- ``text``: every text block it transcribes (headers, footers, page numbers and captions included: what a
  reader of the page sees), for the text and spotting tasks;
- ``markdown``: what OmniDocBench's end-to-end evaluation scores: text blocks, titles, code and references
  (``text``), display formulas (``latex``, as ``$$..$$``) and tables (``html``);
- ``tables``: the tables' HTML.

Boxes are not taken as spotting truth: OmniDocBench's boxes are layout regions, not text lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..batch.plan import Document
from . import EvalError
from .sets import LoadedSet, Sample, Truth

ANNOTATIONS = "OmniDocBench.json"
# Block categories with a "text" transcription (its GT_CATEGORY_LIST)
TEXT_CATEGORIES = frozenset({
    "text_block", "title", "code_txt", "code_txt_caption", "reference", "equation_caption", "figure_caption",
    "figure_footnote", "table_caption", "table_footnote", "code_algorithm", "code_algorithm_caption", "header",
    "footer", "page_footnote", "page_number"})
# Those its end-to-end text score keeps (the others it filters out as ignored categories)
SCORED_TEXT = frozenset({"text_block", "title", "code_txt", "code_txt_caption", "reference"})
_DELIMITERS = re.compile(r"^\s*(\$\$|\$|\\\[)(.*?)(\$\$|\$|\\\])\s*$", re.DOTALL)


def is_omnidocbench(path: Path) -> bool:
    try:
        return annotations_file(path) is not None
    except EvalError:
        return False


def annotations_file(path: Path) -> Path | None:
    """The annotation file a SET names: the file itself, or the folder's OmniDocBench.json (or its one
    top-level .json that is a list of pages with ``layout_dets``)."""
    if path.is_file():
        return path if path.suffix.lower() == ".json" else None
    if not path.is_dir():
        return None
    if (path / ANNOTATIONS).is_file():
        return path / ANNOTATIONS
    candidates = [p for p in sorted(path.glob("*.json")) if _looks_like_pages(p)]
    if len(candidates) > 1:
        raise EvalError(f"{path}: several OmniDocBench annotation files ({', '.join(p.name for p in candidates)}): "
                        "name one")
    return candidates[0] if candidates else None


def _looks_like_pages(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[") and b"layout_dets" in head


def load(path: Path, defaults: Mapping[str, Any], *, use_pdfs: bool = False,
         filters: Mapping[str, str] | None = None) -> LoadedSet:
    """``filters``: page attributes (``page_info.page_attribute``) a page must have, e.g. language=english."""
    annotations = annotations_file(path)
    if annotations is None:
        raise EvalError(f"{path}: no OmniDocBench annotations (OmniDocBench.json) there")
    try:
        pages = json.loads(annotations.read_text(encoding="utf-8-sig"))  # a BOM, as manifests take
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EvalError(f"{annotations}: not an OmniDocBench annotation file ({exc})") from None
    if not isinstance(pages, list):
        raise EvalError(f"{annotations}: expected a list of pages")
    root = annotations.parent
    folder = root / ("pdfs" if use_pdfs else "images")
    folder = folder if folder.is_dir() else root
    loaded = LoadedSet("omnidocbench", str(annotations), [])
    task = defaults.get("task") or "document"
    for number, page in enumerate(pages):
        where = f"{annotations}: page {number}"
        info = page.get("page_info") if isinstance(page, Mapping) else None
        if not isinstance(info, Mapping) or not isinstance(info.get("image_path"), str) or not isinstance(
                page.get("layout_dets"), list):
            raise EvalError(f"{where}: expected layout_dets and page_info.image_path")
        try:
            if not _selected(info.get("page_attribute") or {}, filters or {}):
                continue
            name = Path(info["image_path"]).name
            file = folder / (Path(name).with_suffix(".pdf").name if use_pdfs else name)
            if not file.is_file():
                loaded.skipped_documents.append({"path": str(file), "why": "not in the download"})
                continue
            truth = page_truth(page, where)
        except EvalError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, OSError) as exc:  # a field of another type
            raise EvalError(f"{where}: not OmniDocBench's annotation format ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None
        if truth is None:
            loaded.skipped_documents.append({"path": str(file), "why": "nothing annotated to score"})
            continue
        options = {"task": task, **({"pages": "1"} if use_pdfs else {})}
        loaded.samples.append(Sample(Document(file.resolve(), file.relative_to(root).as_posix(), options), (truth,)))
    if not loaded.samples:
        raise EvalError(f"{annotations}: no page to evaluate (images missing, or none passes the filters)")
    return loaded


def _selected(attributes: Mapping[str, Any], filters: Mapping[str, str]) -> bool:
    return all(str(attributes.get(k, "")).lower() == v.lower() for k, v in filters.items())


def page_truth(page: Mapping[str, Any], where: str) -> Truth | None:
    blocks = [b for b in _merged(page) if isinstance(b, Mapping) and not b.get("ignore")
              and b.get("category_type") != "abandon"]
    blocks.sort(key=lambda b: b.get("order") or 0)
    text, markdown, tables = [], [], []
    for block in blocks:
        category = block.get("category_type")
        if category in TEXT_CATEGORIES and isinstance(block.get("text"), str) and block["text"].strip():
            text.append(block["text"].strip())
            if category in SCORED_TEXT:
                markdown.append(("# " if category == "title" else "") + block["text"].strip())
        elif category == "equation_isolated" and isinstance(block.get("latex"), str):
            markdown.append(f"$$\n{_strip_delimiters(block['latex'])}\n$$")
        elif category == "table" and isinstance(block.get("html"), str) and "<table" in block["html"].lower():
            tables.append(block["html"])
            markdown.append(block["html"])
    if not (text or markdown):
        return None
    return Truth(0, "\n".join(text), "\n\n".join(markdown), tables=tuple(tables) if tables else None)


def _strip_delimiters(latex: str) -> str:
    match = _DELIMITERS.match(latex)
    return match.group(2).strip() if match else latex.strip()


def _merged(page: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The page's blocks with each ``truncated`` group (a paragraph cut by the layout) as one block: its
    texts joined in order, at the first one's place."""
    extra = page.get("extra")
    relations = (extra.get("relation") or []) if isinstance(extra, Mapping) else []
    parent: dict[Any, Any] = {}  # union-find over anno_ids: one root per truncated group

    def root(anno: Any) -> Any:
        parent.setdefault(anno, anno)
        while parent[anno] != anno:
            anno = parent[anno] = parent[parent[anno]]
        return anno

    for rel in relations:
        if isinstance(rel, Mapping) and rel.get("relation_type", rel.get("relation")) == "truncated":
            parent[root(rel.get("source_anno_id"))] = root(rel.get("target_anno_id"))
    group = {anno: root(anno) for anno in list(parent)}
    blocks = page["layout_dets"]
    if not group:
        return list(blocks)
    out, members = [], {}
    for block in blocks:
        number = group.get(block.get("anno_id")) if isinstance(block, Mapping) else None
        if number is None:
            out.append(block)
        else:
            members.setdefault(number, []).append(block)
    for parts in members.values():
        parts.sort(key=lambda b: b.get("order") or 0)
        out.append({**parts[0], "text": "".join(p.get("text") or "" for p in parts),
                    "ignore": all(p.get("ignore") for p in parts)})
    return out
