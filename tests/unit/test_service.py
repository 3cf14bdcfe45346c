"""The pure post-processing rules of the service: build_page and cut_loops."""

from __future__ import annotations

from PIL import Image

from hyocr.hunyuan import versions
from hyocr.pipeline.pages import build_page, cut_loops
from hyocr.types import FinishReason, PageImage, Task, TextBlock, Usage

PAGE = PageImage(Image.new("RGB", (2000, 1000), "white"))


def _page(task: Task, raw: str, **kw):
    return build_page(task, PAGE, raw, (), FinishReason.STOP, Usage(10, 5), **kw)


def test_spotting_boxes_are_converted_to_pixels_of_the_page():
    page = _page(Task.SPOTTING, "Total (USD)(100,200),(300,400)合计 ¥12(500,0),(1000,100)")
    assert [b.text for b in page.blocks] == ["Total (USD)", "合计 ¥12"]
    assert page.blocks[0].box == (200.0, 200.0, 600.0, 400.0)
    assert page.blocks[1].box == (1000.0, 0.0, 2000.0, 100.0)
    assert page.text == "Total (USD)\n合计 ¥12" and page.usage == Usage(10, 5)


def test_detector_blocks_are_kept_as_given():
    block = TextBlock("HELLO", (1.0, 2.0, 3.0, 4.0), 0.9)
    page = build_page(Task.SPOTTING, PAGE, "HELLO(0,0),(1,1)", (block,), FinishReason.STOP, Usage())
    assert page.blocks == (block,)


def test_extraction_parses_fenced_json_and_reports_bad_json():
    ok = _page(Task.EXTRACT, '```json\n{"name": "张三", "id": "4201"}\n```', fields=("name", "id", "date"))
    assert ok.fields == {"name": "张三", "id": "4201", "date": None} and ok.error is None
    bad = _page(Task.EXTRACT, "the name is 张三", fields=("name",))
    assert bad.fields is None and "not valid JSON" in bad.error
    assert bad.raw_text == "the name is 张三"


def test_single_key_extraction_takes_the_bare_value():
    page = _page(Task.EXTRACT, " INV-001 \n", fields=("发票号码",), single_key=True)
    assert page.fields == {"发票号码": "INV-001"} and page.error is None


def test_document_markdown_fence_is_removed():
    page = _page(Task.DOCUMENT, "```markdown\n# Title\n\n<table></table>\n```")
    assert page.markdown == "# Title\n\n<table></table>" and page.text == page.markdown


def test_long_looping_output_is_trimmed_and_flagged():
    raw = "Invoice 42\n" + "重复的句子。" * 600
    assert len(raw) >= versions.V1_5.trim_min_chars
    page = _page(Task.TEXT, raw)
    assert page.finish_reason is FinishReason.REPETITION
    assert page.text == "Invoice 42\n重复的句子。"
    assert page.raw_text == raw


def test_the_clean_up_follows_the_model_version():
    """The authors' clean-up: 1.0 checks outputs of 8000 characters and more, 1.5 of 2000 and more."""
    raw = "Invoice 42\n" + "重复的句子。" * 600  # 3611 characters
    assert cut_loops(raw, FinishReason.STOP, True, versions.V1_5)[1] is FinishReason.REPETITION
    assert cut_loops(raw, FinishReason.STOP, True, versions.V1_0) == (raw, FinishReason.STOP)
    longer = raw + "重复的句子。" * 800
    assert cut_loops(longer, FinishReason.STOP, True, versions.V1_0) == ("Invoice 42\n重复的句子。", FinishReason.REPETITION)


def test_short_runs_are_never_cut_and_detector_text_is_never_touched():
    form = "Account: 0000000000 ---------- ............"
    assert cut_loops(form, FinishReason.STOP, True) == (form, FinishReason.STOP)
    long_table = "0.00 " * 1000
    assert cut_loops(long_table, FinishReason.STOP, False) == (long_table, FinishReason.STOP)


def test_guard_stopped_text_is_cut_by_the_guard_rule():
    text = "Total 10.00 " + "repeat this " * 25
    cut, finish = cut_loops(text, FinishReason.REPETITION, True)
    assert finish is FinishReason.REPETITION and cut.rstrip() == "Total 10.00 repeat this"
    assert cut_loops(text, FinishReason.LENGTH, True)[1] is FinishReason.LENGTH
