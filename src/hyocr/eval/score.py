"""Each truth against what was read (a /v1/ocr body), then the scores summed over a set.

A page that failed, or a document that could not be read, is scored as an empty output: an engine does not
score better by failing on the hard pages (its failures are also counted in the report's operational part).
Per family, a page gives counts; the set's "micro" figures are ratios of the summed counts (every character,
box or field weighs the same), "macro" ones means of the pages' own ratios (every page weighs the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from .metrics import boxes, fields, markdown, tables, text
from .sets import Sample, Truth

POINTS_PER_INCH = 72.0
TABLE_TASKS = ("document", "table")  # outputs that can hold tables


@dataclass(frozen=True, slots=True)
class Output:
    """What a page (or a whole document, its pages joined) gave, in the shape the metrics compare."""

    text: str = ""
    markdown: str | None = None
    fields: dict[str, Any] | None = None
    blocks: tuple[tuple[str, tuple[float, ...]], ...] = ()
    dpi: float | None = None
    finish_reason: str = "error"
    error: str | None = None

    @classmethod
    def of_page(cls, page: Mapping[str, Any]) -> Output:
        return cls(page.get("text") or "", page.get("markdown"), page.get("fields"),
                   tuple((b.get("text") or "", tuple(b["box"])) for b in page.get("blocks") or () if b.get("box")),
                   page.get("dpi"), page.get("finish_reason") or "stop", page.get("error"))

    @classmethod
    def of_document(cls, body: Mapping[str, Any]) -> Output:
        pages = [cls.of_page(p) for p in body.get("pages") or ()]
        merged: dict[str, Any] = {}
        for page in pages:  # extraction over several pages: a field's first value found
            for key, value in (page.fields or {}).items():
                if merged.get(key) in (None, "") and value not in (None, ""):
                    merged[key] = value
        failed = [p for p in pages if p.finish_reason == "error"]
        return cls(body.get("text") or "", body.get("markdown"),
                   merged if any(p.fields is not None for p in pages) else None,
                   finish_reason="error" if pages and len(failed) == len(pages) else "stop",
                   error="; ".join(p.error for p in failed if p.error) or None)


def outputs(truth: Truth, body: Mapping[str, Any] | None, error: str | None) -> Output:
    """The output a truth is compared with; an empty one, carrying why, when there is none."""
    if body is None:
        return Output(error=error or "the document was not read")
    if truth.page is None:
        return Output.of_document(body)
    page = next((p for p in body.get("pages") or () if p.get("index") == truth.page), None)
    if page is None:
        return Output(error=f"page {truth.page + 1} is not in the result")
    return Output.of_page(page)


def _scaled(blocks: tuple, output_dpi: float | None, truth_dpi: float | None) -> list[tuple[str, tuple]]:
    """Output boxes in the truth's pixels: a PDF page's boxes are in pixels at the DPI it was read at."""
    if output_dpi is None:
        return list(blocks)
    scale = (truth_dpi or POINTS_PER_INCH) / output_dpi
    return [(t, tuple(v * scale for v in box)) for t, box in blocks]


def score_truth(truth: Truth, out: Output, task: str, *, schema: Mapping[str, Any] | None = None,
                fold_case: bool = False) -> dict[str, Any]:
    """Per family, this page's counts and ratios."""
    scores: dict[str, Any] = {}
    if truth.text is not None:
        read = out.text if out.markdown is None else markdown.plain(out.markdown)
        scores["text"] = text.score_text(truth.text, read, fold_case=fold_case).as_dict()
    if truth.blocks is not None:
        got = _scaled(out.blocks, out.dpi, truth.dpi)
        scores["spotting"] = boxes.score_boxes([(b.text, b.box) for b in truth.blocks], got,
                                               fold_case=fold_case).as_dict()
    if truth.fields is not None:
        scores["extraction"] = fields.score_fields(truth.fields, out.fields, schema=schema,
                                                   fold_case=fold_case).as_dict()
    reference = markdown.split(truth.markdown) if truth.markdown is not None else None
    want_tables = list(truth.tables) if truth.tables is not None else (reference.tables if reference else [])
    if want_tables and task in TABLE_TASKS:
        got_tables = markdown.split(out.markdown if out.markdown is not None else out.text).tables
        scores["tables"] = [{"teds": a, "teds_structure": b} for a, b in tables.score_tables(want_tables, got_tables)]
    if reference is not None and task == "document":
        parts = markdown.split(out.markdown if out.markdown is not None else out.text)
        formulas = markdown.score_formulas(reference.formulas, parts.formulas)
        scores["markdown"] = {"text": text.score_text(reference.text, parts.text, fold_case=fold_case).as_dict(),
                              "formulas": formulas.formulas, "formula_edits": formulas.edits,
                              "formula_length": formulas.length, "formula_ned": formulas.ned}
    return scores


def score_sample(sample: Sample, body: Mapping[str, Any] | None, error: str | None, *,
                 fold_case: bool = False) -> list[dict[str, Any]]:
    """A row per truth of the sample: where it is, how the page ended, its scores."""
    rows = []
    for truth in sample.truths:
        out = outputs(truth, body, error)
        rows.append({"document": sample.document.rel, "page": None if truth.page is None else truth.page + 1,
                     "finish_reason": out.finish_reason, "error": out.error,
                     "scores": score_truth(truth, out, sample.task, schema=sample.schema, fold_case=fold_case)})
    return rows


# ------------------------------------------------------------------ over a set


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def _text_summary(rows: list[dict]) -> dict[str, Any]:
    total = {k: sum(r[k] for r in rows) for k in ("chars", "char_edits", "words", "word_edits", "ned_edits",
                                                   "ned_length", "shared_words", "output_words")}
    return {"pages": len(rows), "characters": total["chars"], "words": total["words"],
            "cer": _ratio(total["char_edits"], total["chars"]), "cer_macro": _mean([r["cer"] for r in rows]),
            "wer": _ratio(total["word_edits"], total["words"]), "wer_macro": _mean([r["wer"] for r in rows]),
            "ned": _ratio(total["ned_edits"], total["ned_length"]) or 0.0,
            "ned_macro": _mean([r["ned"] for r in rows]),
            "word_precision": _ratio(total["shared_words"], total["output_words"]),
            "word_recall": _ratio(total["shared_words"], total["words"]),
            "word_f1": boxes.f1(total["shared_words"], total["output_words"], total["words"])}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The set's scores per family (only the families its truth holds)."""
    family = {name: [r["scores"][name] for r in rows if name in r["scores"]]
              for name in ("text", "spotting", "extraction", "tables", "markdown")}
    out: dict[str, Any] = {}
    if family["text"]:
        out["text"] = _text_summary(family["text"])
    if spots := family["spotting"]:
        t = {k: sum(s[k] for s in spots) for k in ("reference", "predicted", "matched", "iou_sum", "text_exact",
                                                    "text_chars", "text_edits")}
        out["spotting"] = {
            "pages": len(spots), "reference_boxes": t["reference"], "predicted_boxes": t["predicted"],
            "matched": t["matched"], "precision": _ratio(t["matched"], t["predicted"]),
            "recall": _ratio(t["matched"], t["reference"]), "f1": boxes.f1(t["matched"], t["predicted"], t["reference"]),
            "f1_macro": _mean([s["f1"] for s in spots]), "mean_iou": _ratio(t["iou_sum"], t["matched"]),
            "matched_text_exact": _ratio(t["text_exact"], t["matched"]),
            "matched_text_cer": _ratio(t["text_edits"], t["text_chars"])}
    if pages := family["extraction"]:
        out["extraction"] = _fields_summary(pages)
    if family["tables"]:
        scored = [t for page in family["tables"] for t in page]
        out["tables"] = {"tables": len(scored), "teds": _mean([t["teds"] for t in scored]),
                         "teds_structure": _mean([t["teds_structure"] for t in scored])}
    if docs := family["markdown"]:
        text_part = _text_summary([d["text"] for d in docs])
        out["markdown"] = {"pages": len(docs), "text_ned": text_part["ned"], "text_ned_macro": text_part["ned_macro"],
                           "text_cer": text_part["cer"], "formulas": sum(d["formulas"] for d in docs),
                           "formula_ned": _ratio(sum(d["formula_edits"] for d in docs),
                                                 sum(d["formula_length"] for d in docs))}
    return out


def _fields_summary(pages: list[dict]) -> dict[str, Any]:
    t = {k: sum(p[k] for p in pages) for k in ("fields", "exact", "similarity_sum", "reference_found",
                                                "output_found", "correct")}
    per_field: dict[str, list[tuple[bool, float]]] = {}
    for page in pages:
        for path, value in page["per_field"].items():
            per_field.setdefault(path, []).append((value["exact"], value["similarity"]))
    validity = [p["schema_valid"] for p in pages if p["schema_valid"] is not None]
    return {"pages": len(pages), "fields": t["fields"], "exact_match": _ratio(t["exact"], t["fields"]),
            "similarity": _ratio(t["similarity_sum"], t["fields"]),
            "precision": _ratio(t["correct"], t["output_found"]), "recall": _ratio(t["correct"], t["reference_found"]),
            "f1": boxes.f1(t["correct"], t["output_found"], t["reference_found"]),
            "schema_valid_rate": _mean([float(v) for v in validity]) if validity else None,
            "per_field": {path: {"n": len(v), "exact_match": fmean(e for e, _ in v), "similarity": fmean(s for _, s in v)}
                          for path, v in sorted(per_field.items())}}
