"""hyocr eval's scoring of /v1/ocr bodies against truths, and the set's micro and macro figures by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyocr.batch.plan import Document
from hyocr.eval import EvalError, metrics
from hyocr.eval.score import score_sample, summarize
from hyocr.eval.sets import Block, Sample, Truth


def sample(truths, task="text", schema=None) -> Sample:
    return Sample(Document(Path("/x/doc.pdf"), "doc.pdf", {"task": task}), tuple(truths), schema)


def page(index, text="", **extra) -> dict:
    return {"index": index, "width": 100, "height": 100, "text": text, "blocks": [], "finish_reason": "stop",
            **extra}


def test_micro_and_macro_by_hand():
    # page 1: "abcd" read "abcx" (1 edit of 4); page 2: "ab" read "" (2 edits of 2)
    body = {"text": "abcx", "pages": [page(0, "abcx"), page(1, "")]}
    rows = score_sample(sample([Truth(0, "abcd"), Truth(1, "ab")]), body, None)
    text = summarize(rows)["text"]
    assert text["cer"] == pytest.approx(3 / 6)  # micro: every character weighs the same
    assert text["cer_macro"] == pytest.approx((1 / 4 + 2 / 2) / 2)  # macro: every page weighs the same
    assert text["pages"] == 2 and text["characters"] == 6


def test_a_failed_page_and_an_unread_document_score_as_empty_outputs():
    body = {"text": "", "pages": [page(0, finish_reason="error", error="page 1: the engine failed")]}
    rows = score_sample(sample([Truth(0, "hello"), Truth(4, "gone")]), body, None)
    assert rows[0]["error"] == "page 1: the engine failed" and rows[0]["scores"]["text"]["cer"] == 1.0
    assert rows[1]["error"] == "page 5 is not in the result" and rows[1]["scores"]["text"]["cer"] == 1.0
    unread = score_sample(sample([Truth(0, "hello")]), None, "job failed")
    assert unread[0]["error"] == "job failed" and unread[0]["scores"]["text"]["char_edits"] == 5


def test_a_document_truth_is_compared_with_its_pages_joined():
    body = {"text": "first page\n\nsecond page", "pages": [page(0, "first page"), page(1, "second page", fields={
        "total": "3"}), page(2, "", fields={"total": "9", "date": "2026"})]}
    rows = score_sample(sample([Truth(None, "first page second page", fields={"total": 3, "date": "2026"})],
                               task="extract"), body, None)
    assert rows[0]["page"] is None and rows[0]["scores"]["text"]["cer"] == 0.0
    assert rows[0]["scores"]["extraction"]["exact"] == 2  # a field's first value found over the pages


def test_pdf_boxes_are_compared_in_the_truths_resolution():
    # the page was read at 144 dpi: its boxes are twice the PDF points the truth is in
    body = {"text": "TITLE", "pages": [page(0, "TITLE", dpi=144, blocks=[{"text": "TITLE", "box": [20, 20, 220, 60]}])]}
    rows = score_sample(sample([Truth(0, blocks=(Block("TITLE", (10, 10, 110, 30)),))], task="spotting"), body, None)
    spots = rows[0]["scores"]["spotting"]
    assert spots["matched"] == 1 and spots["iou_sum"] == pytest.approx(1.0)
    at_dpi = score_sample(sample([Truth(0, blocks=(Block("TITLE", (20, 20, 220, 60)),), dpi=144)],
                                 task="spotting"), body, None)
    assert at_dpi[0]["scores"]["spotting"]["iou_sum"] == pytest.approx(1.0)


def test_tables_and_markdown_are_scored_for_outputs_that_can_hold_them():
    reference = "Intro\n\n$$x^2$$\n\n<table><tr><td>1</td></tr></table>"
    body = {"text": "Intro", "pages": [page(0, reference, markdown=reference)]}
    doc = score_sample(sample([Truth(0, markdown=reference)], task="document"), body, None)[0]["scores"]
    assert doc["tables"] == [{"teds": 1.0, "teds_structure": 1.0}]
    assert doc["markdown"]["text"]["ned"] == 0.0 and doc["markdown"]["formula_ned"] == 0.0
    plain = score_sample(sample([Truth(0, markdown=reference)], task="text"), {"text": "Intro", "pages": [
        page(0, "Intro")]}, None)[0]["scores"]
    assert plain == {}  # a text output holds neither: nothing to say about them
    summary = summarize([{"scores": doc}])
    assert summary["tables"] == {"tables": 1, "teds": 1.0, "teds_structure": 1.0}
    assert summary["markdown"]["formulas"] == 1


def test_a_missing_metric_library_is_named_before_anything_runs(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "apted" else real(name, *a))
    with pytest.raises(EvalError, match=r"pip install 'hyocr\[eval\]'.*missing: apted"):
        metrics.require()


def test_a_label_with_a_pipe_stays_in_its_cell():
    from hyocr.eval.report import md_cell

    assert md_cell("run|A") == "run\\|A" and md_cell("two\nlines") == "two lines"
    row = f"| {md_cell('run|A')} | 0.1 |"
    assert len(row.replace("\\|", "").split("|")) == 4  # three cells' borders: the label added no column
