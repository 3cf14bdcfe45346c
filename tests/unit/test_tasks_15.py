"""HunyuanOCR 1.5's task-locked prompts and the parsers of their answers (hunyuan/prompts.py, layout.py)."""

from __future__ import annotations

import json

from hyocr.hunyuan.layout import parse_layout
from hyocr.hunyuan.prompts import PROMPTS_15, build_prompt, match_prompt
from hyocr.pipeline.pages import build_page
from hyocr.types import FinishReason, PageImage, Task, Usage


def test_15_gets_its_own_wording_and_10_keeps_its_prompts():
    assert build_prompt(Task.DOCUMENT, version="1.5") == PROMPTS_15[Task.DOCUMENT]
    assert build_prompt(Task.DOCUMENT) != PROMPTS_15[Task.DOCUMENT]  # 1.0's has spaces around markdown
    assert build_prompt(Task.TRANSLATE, target_language="en", version="1.5").endswith("再将文字内容翻译为英文。")
    assert build_prompt(Task.DOCUMENT, prompt_language="en", version="1.5").startswith("Extract all information")
    assert build_prompt(Task.LAYOUT) == "按照阅读顺序解析图中的版式信息。"
    assert build_prompt(Task.SPOTTING_JSON, prompt_language="en").startswith("检测并识别图中所有的文字行")


def test_a_chat_client_sending_a_15_prompt_gets_its_task():
    assert match_prompt(build_prompt(Task.SPOTTING_JSON)).task is Task.SPOTTING_JSON
    assert match_prompt("按照阅读顺序解析图中的版式信息。").task is Task.LAYOUT
    assert match_prompt(PROMPTS_15[Task.TABLE]).task is Task.TABLE
    m = match_prompt(build_prompt(Task.TRANSLATE, target_language="zh", version="1.5"))
    assert (m.task, m.target_language) == (Task.TRANSLATE, "zh")


def test_layout_in_both_of_the_authors_formats():
    tagged = ("Title<hy-meta><layout>title</layout><poly>(100,50),(900,50),(900,100),(100,100)</poly></hy-meta>"
              "Body text<hy-meta><layout>paragraph</layout><quad>(100,200),(900,600)</quad></hy-meta>")
    blocks = parse_layout(tagged, 1000, 2000)
    assert [(b.text, b.category) for b in blocks] == [("Title", "section_title"), ("Body text", "paragraph")]
    assert blocks[0].box == (100.0, 100.0, 900.0, 200.0) and len(blocks[0].polygon) == 4  # 0-1000 -> pixels
    assert blocks[1].box == (100.0, 400.0, 900.0, 1200.0)
    as_json = json.dumps([{"layout_type": "table", "bbox": "(0,0),(500,0),(500,500),(0,500)", "text": "<table/>"},
                          {"layout_type": "page_header", "bbox": [[0, 0], [1000, 0], [1000, 40], [0, 40]]}])
    blocks = parse_layout(as_json, 200, 100)
    assert [(b.category, b.box) for b in blocks] == [("table", (0.0, 0.0, 100.0, 50.0)), ("header", (0.0, 0.0, 200.0, 4.0))]
    assert [b.text for b in parse_layout("no layout here", 10, 10)] == ["no layout here"]
    assert parse_layout("", 10, 10) == []


def test_pages_of_the_15_tasks():
    page = PageImage(None, size=(1000, 500))
    spotted = build_page(Task.SPOTTING_JSON, page, '[{"box": [0, 0, 500, 1000], "text": "HELLO"}]', (),
                         FinishReason.STOP, Usage())
    assert spotted.text == "HELLO" and spotted.blocks[0].box == (0.0, 0.0, 500.0, 500.0)
    laid = build_page(Task.LAYOUT, page, "Hi<hy-meta><layout>figure</layout><poly>(0,0),(10,10)</poly></hy-meta>", (),
                      FinishReason.STOP, Usage())
    assert laid.text == "Hi" and laid.blocks[0].category == "figure"


def test_layout_parsing_of_long_untagged_or_deeply_nested_output_returns():
    assert [b.text for b in parse_layout("x" * 50_000, 10, 10)] == ["x" * 50_000]
    assert parse_layout("[" * 100_000, 10, 10)[0].text.startswith("[[[")
