"""What an evaluation reads and against what: samples, each a batch ``Document`` (a file and the options it is
read with) and the truth of its pages. A SET is a JSONL manifest (this file), an OmniDocBench folder
(``omnidocbench.py``) or a pile of PDFs whose own text layer is the reference (``pdf_text.py``).

A manifest line: ``{"path": "scan.png" | "doc.pdf", "pages": "1-2"?, "task": "text"?, "truth": {...},
"schema": {...}?, "fields": [...]?, "language": ..., "question": ...}``, paths relative to the manifest.
``truth`` holds any of ``text``, ``markdown``, ``fields`` (an object), ``blocks`` (``[{"text", "box":
[x1, y1, x2, y2]}]`` in the image's pixels; for a PDF page in points, or at ``"dpi"``) and ``tables`` (HTML).
It is the document's truth (a PDF's pages joined); per page instead, ``"pages": [{"page": 3, ...truth},
...]`` (1-based; without ``page``, the list is pages 1, 2, ...), which also selects the pages read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..batch.plan import Document, shown
from . import EvalError

TRUTH_KEYS = ("text", "markdown", "fields", "blocks", "tables", "dpi")
LINE_KEYS = ("path", "pages", "task", "truth", "schema", "fields", "language", "question")


@dataclass(frozen=True, slots=True)
class Block:
    text: str
    box: tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Truth:
    """The reference of one page (``page``, 0-based) or, with ``page`` None, of the whole document."""

    page: int | None
    text: str | None = None
    markdown: str | None = None
    fields: dict[str, Any] | None = None
    blocks: tuple[Block, ...] | None = None
    tables: tuple[str, ...] | None = None
    dpi: float | None = None  # PDF pages: the resolution ``blocks`` are in (default 72, the page's points)

    def kinds(self) -> list[str]:
        return [k for k in TRUTH_KEYS[:-1] if getattr(self, k) is not None]


@dataclass(frozen=True, slots=True)
class Sample:
    document: Document  # its overrides: the options it is read with (task, pages, fields, ...)
    truths: tuple[Truth, ...]
    schema: dict[str, Any] | None = None
    skipped: tuple[tuple[int, str], ...] = ()  # (page, why) of pages left without a reference

    @property
    def task(self) -> str:
        return self.document.overrides.get("task") or "spotting"


@dataclass(slots=True)
class LoadedSet:
    kind: str  # manifest | omnidocbench | pdf-text
    path: str
    samples: list[Sample]
    skipped_documents: list[dict[str, str]] = field(default_factory=list)  # {"path", "why"}

    def fingerprint(self) -> str:
        """The same documents with the same truth: reports of sets with equal fingerprints compare."""
        digest = hashlib.sha256()
        for s in self.samples:
            digest.update(json.dumps([s.document.rel, dict(s.document.overrides), [asdict(t) for t in s.truths],
                                      s.schema], sort_keys=True, ensure_ascii=False, default=list)
                          .encode("utf-8", "surrogatepass"))  # a file name that is not UTF-8 (os.fsdecode's escapes)
        return digest.hexdigest()[:16]


def infer_task(truths: Iterable[Truth]) -> str:
    """The task whose output a truth scores: extraction for fields, spotting for boxes, document parsing
    for markdown, table for tables alone, else text."""
    kinds = {k for t in truths for k in t.kinds()}
    for kind, task in (("fields", "extract"), ("blocks", "spotting"), ("markdown", "document"),
                       ("tables", "table")):
        if kind in kinds:
            return task
    return "text"


def parse_truth(value: Any, page: int | None, where: str) -> Truth:
    if not isinstance(value, Mapping):
        raise EvalError(f"{where}: a truth is an object with {', '.join(TRUTH_KEYS)}")
    if unknown := set(value) - set(TRUTH_KEYS) - {"page"}:
        raise EvalError(f"{where}: unknown truth key(s) {', '.join(sorted(unknown))}")
    for key in ("text", "markdown"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise EvalError(f"{where}: truth {key} must be a string")
    if value.get("fields") is not None and not isinstance(value["fields"], Mapping):
        raise EvalError(f"{where}: truth fields must be an object")
    tables = value.get("tables")
    if isinstance(tables, str):
        tables = [tables]
    if tables is not None and not (isinstance(tables, list) and all(isinstance(t, str) for t in tables)):
        raise EvalError(f"{where}: truth tables must be HTML strings")
    dpi = value.get("dpi")
    if dpi is not None and (isinstance(dpi, bool) or not isinstance(dpi, int | float) or dpi <= 0):
        raise EvalError(f"{where}: truth dpi must be a positive number")
    truth = Truth(page, value.get("text"), value.get("markdown"), dict(value["fields"]) if value.get("fields")
                  is not None else None, _blocks(value.get("blocks"), where), tuple(tables) if tables is not None
                  else None, dpi)
    if not truth.kinds():
        raise EvalError(f"{where}: the truth holds nothing to score ({', '.join(TRUTH_KEYS[:-1])})")
    return truth


def _blocks(value: Any, where: str) -> tuple[Block, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise EvalError(f"{where}: truth blocks must be a list of {{'text', 'box'}}")
    out = []
    for i, item in enumerate(value):
        box = item.get("box") if isinstance(item, Mapping) else None
        if not (isinstance(item, Mapping) and isinstance(item.get("text"), str) and isinstance(box, list)
                and len(box) == 4 and all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
                and box[0] <= box[2] and box[1] <= box[3]):
            raise EvalError(f"{where}: truth blocks[{i}] must be {{'text': str, 'box': [x1, y1, x2, y2]}} "
                            "with x1 <= x2, y1 <= y2")
        out.append(Block(item["text"], tuple(float(v) for v in box)))  # type: ignore[arg-type]
    return tuple(out)


def _is_pdf(path: Path) -> bool:
    """A document of pages: a PDF, or a TIFF of several pages (read, and given truths, page by page as a PDF)."""
    if path.suffix.lower() == ".pdf":
        return True
    with path.open("rb") as f:
        head = f.read(5)
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        from ..pipeline.media import is_document

        return is_document(path.read_bytes())
    return head == b"%PDF-"


def load_manifest(manifest: Path, defaults: Mapping[str, Any]) -> LoadedSet:
    """``defaults``: the command line's read options (task, fields, ...); a line's own override them."""
    samples, seen = [], {}
    base = manifest.parent
    try:
        raw_lines = manifest.read_bytes().splitlines()
    except OSError as exc:
        raise EvalError(f"{manifest}: {exc.strerror or exc}") from None
    for number, raw in enumerate(raw_lines, 1):
        where = f"{manifest}:{number}"
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # Windows Notepad starts with a BOM
        except UnicodeDecodeError as exc:
            raise EvalError(f"{where}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1}); a "
                            "manifest is JSON lines") from None
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise EvalError(f"{where}: not JSON ({exc})") from None
        except RecursionError:
            raise EvalError(f"{where}: not JSON (nested too deeply)") from None
        try:
            sample = _manifest_sample(entry, base, defaults, where)
        except OSError as exc:  # a name the filesystem refuses (over 255 bytes): said short, never whole
            raise EvalError(f"{where}: {shown(entry.get('path'))}: {exc.strerror or type(exc).__name__}") from None
        if (first := seen.setdefault(sample.document.key, number)) != number:
            raise EvalError(f"{where}: the same document and options as line {first}")
        samples.append(sample)
    if not samples:
        raise EvalError(f"{manifest}: no labelled documents")
    return LoadedSet("manifest", str(manifest), samples)


def _manifest_sample(entry: Any, base: Path, defaults: Mapping[str, Any], where: str) -> Sample:
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise EvalError(f'{where}: expected an object with "path"')
    if unknown := set(entry) - set(LINE_KEYS):
        raise EvalError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    path = Path(entry["path"]).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise EvalError(f"{where}: {shown(entry['path'])}: " + ("a folder, not a file" if path.is_dir()
                                                                  else "no such file"))
    pdf = _is_pdf(path)
    pages = entry.get("pages")
    selection = None
    if isinstance(pages, list):
        if entry.get("truth") is not None:
            raise EvalError(f'{where}: give "truth" (the document\'s) or "pages" (a truth per page), not both')
        truths, selection = _page_truths(pages, pdf, where)
    else:
        if pages is not None and not isinstance(pages, str):
            raise EvalError(f'{where}: "pages" is a selection such as "1-3" or a list of page truths')
        if pages is not None and not pdf:
            raise EvalError(f'{where}: "pages" selects pages of a PDF (or a TIFF of several pages); '
                            f'{entry["path"]} is an image')
        if pages is not None:
            from ..batch.pages import check as check_pages

            _check(where, check_pages, pages)
        selection = pages
        truth = parse_truth(entry.get("truth"), None if pdf else 0, where)
        if pdf and truth.blocks is not None:
            raise EvalError(f'{where}: boxes are per page: give a PDF\'s blocks in "pages": [{{"page": N, ...}}]')
        truths = (truth,)
    schema = entry.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise EvalError(f"{where}: schema must be a JSON Schema object")
    options = {k: entry[k] for k in ("task", "fields", "language", "question") if entry.get(k) is not None}
    if "task" in options:
        from ..hunyuan.prompts import parse_task

        _check(where, parse_task, options["task"])
    task = options.get("task") or defaults.get("task") or infer_task(truths)
    options["task"] = task
    if task == "extract" and not (options.get("fields") or defaults.get("fields")):
        keys = list((schema or {}).get("properties") or {}) or sorted({k for t in truths for k in t.fields or {}})
        if keys:
            options["fields"] = keys
    if selection:
        options["pages"] = selection
    try:
        rel = path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        rel = path.name
    return Sample(Document(path.resolve(), rel, options), truths, schema)


def _check(where: str, check: Any, value: object) -> None:
    """``check(value)`` as the server would check it (batch's page selection, the task's name); its
    refusal as this line's EvalError."""
    from ..errors import HyocrError

    try:
        check(value)
    except HyocrError as exc:
        raise EvalError(f"{where}: {exc.message}") from None


def _page_truths(pages: list, pdf: bool, where: str) -> tuple[tuple[Truth, ...], str | None]:
    if not pages:
        raise EvalError(f'{where}: "pages" is empty')
    numbered = [isinstance(p, Mapping) and p.get("page") is not None for p in pages]
    if any(numbered) and not all(numbered):
        raise EvalError(f'{where}: give "page" in every entry of "pages", or in none')
    numbers = []
    for i, item in enumerate(pages):
        number = item.get("page", i + 1) if isinstance(item, Mapping) else i + 1
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise EvalError(f"{where}: pages[{i}].page must be a page number (1-based)")
        numbers.append(number)
    if len(set(numbers)) != len(numbers):
        raise EvalError(f"{where}: a page is listed twice in \"pages\"")
    if not pdf and numbers != [1]:
        raise EvalError(f"{where}: an image has one page")
    truths = []
    for i, (item, number) in enumerate(zip(pages, numbers, strict=True)):
        value = item.get("truth", {k: v for k, v in item.items() if k != "page"}) if isinstance(item, Mapping) else item
        truths.append(parse_truth(value, number - 1, f"{where}: pages[{i}]"))
    return tuple(truths), (",".join(map(str, sorted(numbers))) if pdf else None)
