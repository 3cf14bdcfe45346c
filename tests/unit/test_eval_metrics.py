"""hyocr eval's metrics against values computed by hand."""

from __future__ import annotations

import pytest

from hyocr.eval.metrics import boxes, fields, markdown, tables, text


def test_cer_wer_and_ned_by_hand():
    # kitten -> sitting: k->s, e->i, +g: 3 edits over 6 reference characters
    s = text.score_text("kitten", "sitting")
    assert (s.chars, s.char_edits, s.cer) == (6, 3, 0.5)
    assert s.ned == pytest.approx(3 / 7)  # over the longer string
    # the cat sat -> the cat sit down: one substitution, one insertion over 3 reference words
    w = text.score_text("the cat sat", "the cat sit down")
    assert (w.words, w.word_edits, w.wer) == (3, 2, pytest.approx(2 / 3))
    assert (w.shared_words, w.output_words) == (2, 4)  # bag of words: "the", "cat"
    # order does not matter to the bag of words, it does to WER
    swapped = text.score_text("alpha beta gamma", "gamma alpha beta")
    assert swapped.shared_words == 3 and swapped.word_edits == 2


def test_normalisation_as_omnidocbench_does_it():
    assert text.normalize("ＡＢＣ１２３\u3000x") == "ABC123 x"  # full-width forms and the ideographic space
    assert text.normalize("ﬁne  \n\t print ") == "fine print"  # a PDF ligature, whitespace runs
    # NED ignores spacing and punctuation (OmniDocBench's clean_string); case only when folded
    s = text.score_text("Hello, World!", "hello world")
    assert (s.ned_edits, s.ned_length) == (2, 10) and s.ned == pytest.approx(0.2)
    assert text.score_text("Hello, World!", "hello world", fold_case=True).ned == 0.0
    assert text.score_text("Hello, World!", "hello world", fold_case=True).char_edits == 2  # , and !
    # a dot leader is fill, not text: the text layer's 37 dots and an OCR's two score alike
    contents = "2.1 ASN.1 syntax" + ". " * 37 + "2\nNaming \u00b7\u00b7\u00b7\u00b7\u00b7 3"
    assert text.normalize(contents) == "2.1 ASN.1 syntax 2 Naming 3"
    assert text.score_text(contents, "2.1 ASN.1 syntax .... 2\nNaming . . . . 3").char_edits == 0
    assert text.normalize("wait... and 1.2.3") == "wait... and 1.2.3"  # an ellipsis, a version: kept
    empty = text.score_text("", "")
    assert empty.cer == 0.0 and empty.wer == 0.0 and empty.ned == 0.0 and empty.char_edits == 0
    # an empty reference read as text: wholly wrong (it was left out of the page mean, so it scored nothing)
    noise = text.score_text("", "noise")
    assert noise.cer == 1.0 and noise.wer == 1.0 and noise.char_edits == 5


def test_iou_and_greedy_matching_by_hand():
    assert boxes.iou([0, 0, 10, 10], [5, 0, 15, 10]) == pytest.approx(50 / 150)
    assert boxes.iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    reference = [[0, 0, 100, 20], [0, 30, 100, 50]]
    predicted = [[0, 31, 100, 50],  # IoU 0.95 with the second line
                 [0, 0, 90, 20],    # 0.9 with the first
                 [0, 0, 100, 19],   # 0.95 with the first: it wins, the 0.9 one is left over
                 [0, 0, 40, 20]]    # 0.4: never a match
    pairs = boxes.match(reference, predicted)
    assert [(i, j) for i, j, _ in pairs] == [(0, 2), (1, 0)]
    score = boxes.score_boxes([("ONE", reference[0]), ("TWO", reference[1])],
                              [("TWO", predicted[0]), ("ONE", predicted[1]), ("0NE", predicted[2]),
                               ("x", predicted[3])])
    assert (score.reference, score.predicted, score.matched) == (2, 4, 2)
    assert score.precision == 0.5 and score.recall == 1.0 and score.f1 == pytest.approx(2 / 3)
    assert score.iou_sum == pytest.approx(0.95 + 0.95)
    assert score.text_exact == 1 and (score.text_edits, score.text_chars) == (1, 6)  # 0NE vs ONE
    assert boxes.iou([0, 0, 10, 10], [0, 0, 10, 5]) == 0.5 and boxes.match([[0, 0, 10, 10]], [[0, 0, 10, 5]])
    assert boxes.f1(0, 0, 0) == 1.0  # nothing to find, nothing found


def test_teds_on_small_tables_by_hand():
    two_by_two = "<table><tr><td>ab</td><td>x</td></tr><tr><td>1</td><td>2</td></tr></table>"  # 7 nodes
    assert tables.html_teds(two_by_two, two_by_two) == 1.0
    one_cell_off = "<table><tr><td>ac</td><td>x</td></tr><tr><td>1</td><td>2</td></tr></table>"
    assert tables.html_teds(one_cell_off, two_by_two) == pytest.approx(1 - 0.5 / 7)  # rename cost lev/2
    assert tables.html_teds(one_cell_off, two_by_two, structure_only=True) == 1.0
    one_row = "<table><tr><td>ab</td><td>x</td></tr></table>"  # a row and its two cells missing: 3 of 7
    assert tables.html_teds(one_row, two_by_two) == pytest.approx(1 - 3 / 7)
    # a header cell spanning two columns against two cells: the span differs (1), a cell is missing (1), of 4
    spanned = "<table><thead><tr><th colspan='2'>ab</th></tr></thead></table>"
    assert tables.html_teds(spanned, "<table><tr><td>ab</td><td></td></tr></table>") == pytest.approx(0.5)
    assert tables.html_teds("no table here", two_by_two) == 0.0
    # pairing: each reference table takes its best output table once; one left without scores 0
    pairs = tables.score_tables([two_by_two, one_row], [two_by_two])
    assert pairs == [(1.0, 1.0), (0.0, 0.0)]


def test_field_scores_by_hand():
    reference = {"name": "John Smith", "total": 12.5, "note": "", "items": [{"qty": 2}]}
    output = {"name": "JOHN SMITH", "total": "12.50", "items": [{"qty": 3}], "extra": "x"}
    s = fields.score_fields(reference, output)
    # paths: name, total, note, items[0].qty; exact: total (as numbers), note (empty = empty)
    assert s.fields == 4 and s.exact == 2
    assert s.per_field["name"] == (False, pytest.approx(1 - 7 / 10))  # ohn, mith differ in case: 7 of 10
    assert s.per_field["total"] == (True, 1.0)  # equal as numbers is fully similar, not 4 of 5 characters
    assert fields.score_fields(reference, output, fold_case=True).exact == 3
    # pairs with a value: reference 3 (name, total, qty), output 4; correct: total
    assert (s.reference_found, s.output_found, s.correct) == (3, 4, 1)
    assert s.precision == 0.25 and s.recall == pytest.approx(1 / 3)
    assert s.as_dict()["f1"] == pytest.approx(2 * 1 / (4 + 3))
    nothing = fields.score_fields(reference, None)
    assert nothing.correct == 0 and nothing.exact == 1 and nothing.precision is None  # only "note" right


def test_schema_validity():
    schema = {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}
    assert fields.score_fields({"total": 3}, {"total": 3}, schema=schema).schema_valid is True
    assert fields.score_fields({"total": 3}, {"total": "3"}, schema=schema).schema_valid is False
    assert fields.score_fields({"total": 3}, None, schema=schema).schema_valid is False
    assert fields.score_fields({"total": 3}, {"total": 3}).schema_valid is None


def test_markdown_split_as_omnidocbench():
    page = ("# Title\n\nSome **bold** text.\n\n![fig](a.png)\n\n$$\nE = mc^2\n$$\n\n"
            "<table><tr><td>a</td></tr></table>\n\n| h1 | h2 |\n|---|---|\n| 1 | 2 |\n\nEnd.")
    parts = markdown.split(page)
    assert parts.formulas == ["E = mc^2"]
    assert len(parts.tables) == 2 and "<td>h1</td>" in parts.tables[1] and "<td>2</td>" in parts.tables[1]
    assert text.normalize(parts.text) == "Title Some bold text. End."
    assert markdown.formula_key(r"E = mc^2 \tag{1}") == "e=mc^2"
    f = markdown.score_formulas(["a+b"], ["a + c"])
    assert (f.formulas, f.edits, f.length, f.ned) == (1, 1, 3, pytest.approx(1 / 3))
    assert text.normalize(markdown.plain("<table><tr><td>a</td><td>b</td></tr></table>")) == "a b"
