"""hyocr eval's sets: manifest lines (per document, per page, refused with the line named) and an OmniDocBench
folder in its real format (JSON annotations beside images/)."""

from __future__ import annotations

import json

import omnidocbench_pages as odb
import pytest

from hyocr.eval import EvalError, omnidocbench
from hyocr.eval.sets import infer_task, load_manifest, parse_truth

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "a.png").write_bytes(PNG)
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.7\n%%EOF\n")
    return tmp_path


def manifest(folder, *lines) -> object:
    path = folder / "set.jsonl"
    path.write_text("\n".join(json.dumps(line) if not isinstance(line, str) else line for line in lines) + "\n")
    return path


def test_a_line_per_document_with_its_task_from_its_truth(folder):
    loaded = load_manifest(manifest(
        folder, "# a comment", {"path": "a.png", "truth": {"text": "HELLO", "blocks": [{"text": "HELLO",
                                                                                        "box": [1, 2, 30, 40]}]}},
        {"path": "doc.pdf", "pages": "2-3", "truth": {"markdown": "# T"}},
        {"path": "doc.pdf", "pages": [{"page": 4, "fields": {"total": 3}}, {"page": 2, "text": "x"}]}), {})
    card, whole, paged = loaded.samples
    assert card.task == "spotting" and card.truths[0].page == 0 and card.truths[0].blocks[0].box == (1, 2, 30, 40)
    assert whole.task == "document" and whole.truths[0].page is None and whole.document.overrides["pages"] == "2-3"
    assert paged.task == "extract" and paged.document.overrides["pages"] == "2,4"
    assert [t.page for t in paged.truths] == [3, 1] and paged.document.overrides["fields"] == ["total"]
    assert card.document.rel == "a.png" and loaded.fingerprint() == load_manifest(folder / "set.jsonl", {}).fingerprint()


def test_a_manifest_saved_with_a_byte_order_mark_is_read(folder):
    # Windows Notepad's "UTF-8" starts with one: the first line was "not JSON (Unexpected UTF-8 BOM)"
    path = folder / "set.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"path": "a.png", "truth": {"text": "HI"}}).encode() + b"\n")
    (sample,) = load_manifest(path, {}).samples
    assert sample.truths[0].text == "HI"


def test_a_tiff_of_several_pages_takes_truths_per_page_as_a_pdf(folder):
    import io

    from PIL import Image

    fax, single = io.BytesIO(), io.BytesIO()
    Image.new("1", (64, 32), 1).save(fax, "TIFF", save_all=True, append_images=[Image.new("1", (64, 32), 1)])
    Image.new("1", (64, 32), 1).save(single, "TIFF")
    (folder / "fax.tif").write_bytes(fax.getvalue())
    (folder / "one.tif").write_bytes(single.getvalue())
    loaded = load_manifest(manifest(folder, {"path": "fax.tif", "pages": [{"page": 2, "text": "B"}]}), {})
    (paged,) = loaded.samples
    assert paged.document.overrides["pages"] == "2" and [t.page for t in paged.truths] == [1]
    with pytest.raises(EvalError, match="is an image"):
        load_manifest(manifest(folder, {"path": "one.tif", "pages": "1", "truth": {"text": "x"}}), {})


def test_the_command_line_task_and_a_schema(folder):
    schema = {"type": "object", "properties": {"merchant": {"type": "string"}, "total": {"type": "number"}}}
    loaded = load_manifest(manifest(folder, {"path": "a.png", "schema": schema, "truth": {"fields": {"total": 1}}},
                                    {"path": "a.png", "task": "text", "truth": {"text": "x"}}), {"task": "spotting"})
    extraction, text = loaded.samples
    assert extraction.task == "spotting"  # the command line's --task, where the line names none
    assert text.task == "text"
    loaded = load_manifest(folder / "set.jsonl", {})
    assert loaded.samples[0].document.overrides["fields"] == ["merchant", "total"]  # the schema's properties


@pytest.mark.parametrize(("line", "why"), [
    ("{not json", "not JSON"),
    ({"truth": {"text": "x"}}, 'expected an object with "path"'),
    ({"path": "missing.png", "truth": {"text": "x"}}, "no such file"),
    ({"path": "a.png", "truth": {"text": "x"}, "colour": "red"}, "unknown key(s) colour"),
    ({"path": "a.png", "truth": {"txt": "x"}}, "unknown truth key(s) txt"),
    ({"path": "a.png", "truth": {}}, "holds nothing to score"),
    ({"path": "a.png", "truth": {"blocks": [{"text": "x", "box": [5, 5, 1, 1]}]}}, "x1 <= x2"),
    ({"path": "a.png", "pages": "1-2", "truth": {"text": "x"}}, "is an image"),
    ({"path": "doc.pdf", "truth": {"blocks": []}}, "boxes are per page"),
    ({"path": "doc.pdf", "pages": [{"page": 1, "text": "a"}, {"text": "b"}]}, 'in every entry of "pages"'),
    ({"path": "doc.pdf", "pages": [{"page": 2, "text": "a"}, {"page": 2, "text": "b"}]}, "listed twice"),
    ({"path": "doc.pdf", "pages": [{"text": "a"}], "truth": {"text": "b"}}, "not both"),
])
def test_bad_lines_are_refused_naming_the_line(folder, line, why):
    path = manifest(folder, {"path": "a.png", "truth": {"text": "fine"}}, line)
    with pytest.raises(EvalError) as info:
        load_manifest(path, {})
    assert f"{path}:2" in str(info.value) and why in str(info.value)


def test_a_line_repeated_is_refused(folder):
    line = {"path": "a.png", "truth": {"text": "x"}}
    with pytest.raises(EvalError, match="the same document and options as line 1"):
        load_manifest(manifest(folder, line, line), {})


def test_task_inference_and_truth_types():
    assert infer_task([parse_truth({"text": "x"}, 0, "t")]) == "text"
    assert infer_task([parse_truth({"tables": "<table></table>"}, 0, "t")]) == "table"
    assert infer_task([parse_truth({"text": "x", "markdown": "y"}, 0, "t")]) == "document"
    with pytest.raises(EvalError, match="fields must be an object"):
        parse_truth({"fields": [1]}, 0, "t")


def test_omnidocbench_folder_read_natively(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "report_p7.png").write_bytes(PNG)
    pages = [odb.page("report_p7.png"), odb.page("missing.jpg"), odb.page("report_p7.png", "simplified_chinese")]
    (tmp_path / "OmniDocBench.json").write_text(json.dumps(pages))
    assert omnidocbench.is_omnidocbench(tmp_path)
    loaded = omnidocbench.load(tmp_path, {}, filters={"language": "English"})
    assert len(loaded.samples) == 1 and loaded.skipped_documents == [
        {"path": str(tmp_path / "images" / "missing.jpg"), "why": "not in the download"}]
    sample = loaded.samples[0]
    truth = sample.truths[0]
    assert sample.task == "document" and sample.document.rel == "images/report_p7.png"
    # every transcribed block in reading order, the truncated paragraph joined, abandon and ignore dropped
    assert truth.text == "Annual Report\nRevenue grew in the third quarter.\n7"
    # what its end-to-end score keeps: no page number; the formula without its delimiters; the table
    assert truth.markdown == ("# Annual Report\n\nRevenue grew in the third quarter.\n\n$$\nE=mc^2\n$$\n\n"
                              "<table><tr><td>Q3</td><td>12</td></tr></table>")
    assert truth.tables == ("<table><tr><td>Q3</td><td>12</td></tr></table>",)
    assert len(omnidocbench.load(tmp_path, {}).samples) == 2  # no filter: the Chinese page too


def test_omnidocbench_refusals(tmp_path):
    assert not omnidocbench.is_omnidocbench(tmp_path)
    (tmp_path / "OmniDocBench.json").write_text(json.dumps([{"layout_dets": []}]))
    with pytest.raises(EvalError, match="page 0: expected layout_dets and page_info.image_path"):
        omnidocbench.load(tmp_path, {})
