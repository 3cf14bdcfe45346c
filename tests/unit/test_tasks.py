from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyocr.errors import InvalidRequest
from hyocr.hunyuan.prompts import (
    PROMPTS,
    TASK_DESCRIPTIONS,
    PromptMatch,
    build_prompt,
    build_single_key_prompt,
    match_prompt,
    parse_task,
)
from hyocr.types import Task

# 1.0's prompts (both languages); 1.5's Chinese-only task prompts: test_tasks_15.py
SIMPLE_TASKS = [t for t in Task if t not in (Task.EXTRACT, Task.TRANSLATE, Task.VQA, Task.SPOTTING_JSON, Task.LAYOUT)]

# Copied from docs/HUNYUANOCR.md; the model was trained on these exact strings.
ZH_DOCUMENT = (
    "提取文档图片中正文的所有信息用 markdown 格式表示，其中页眉、页脚部分忽略，"
    "表格用 html 格式表达，文档中公式用 latex 格式表示，按照阅读顺序组织进行解析。"
)
EN_DOCUMENT = (
    "Extract all information from the main body of the document image and represent it in markdown format, "
    "ignoring headers and footers. Tables should be expressed in HTML format, formulas in the document "
    "should be represented using LaTeX format, and the parsing should be organized according to the "
    "reading order."
)
EN_CHART = "Parse the chart in the image; use Mermaid format for flowcharts and Markdown for other charts."
OFFICIAL = [
    (Task.SPOTTING, "zh", "检测并识别图片中的文字，将文本坐标格式化输出。"),
    (Task.TEXT, "en", "Extract the text in the image."),
    (Task.DOCUMENT, "zh", ZH_DOCUMENT),
    (Task.DOCUMENT, "en", EN_DOCUMENT),
    (Task.TABLE, "zh", "把图中的表格解析为 HTML。"),
    (Task.CHART, "en", EN_CHART),
    (Task.SUBTITLES, "zh", "提取图片中的字幕。"),
    (Task.FORMULA, "en", "Identify the formula in the image and represent it using LaTeX format."),
]


@pytest.mark.parametrize(("task", "lang", "prompt"), OFFICIAL)
def test_build_prompt_is_verbatim(task: Task, lang: str, prompt: str) -> None:
    assert build_prompt(task, prompt_language=lang) == prompt


def test_every_task_has_both_languages_and_a_description() -> None:
    for task in Task:
        assert set(PROMPTS[task]) == {"zh", "en"}
        assert TASK_DESCRIPTIONS[task].strip()


def test_default_prompt_language_is_chinese() -> None:
    assert build_prompt(Task.TEXT) == "提取图中的文字。"


def test_build_prompt_accepts_task_names() -> None:
    assert build_prompt("extract", fields=["a"]) == build_prompt(Task.EXTRACT, fields=["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        build_prompt("summarize")  # type: ignore[arg-type]


def test_extract_prompt_format() -> None:
    assert (
        build_prompt(Task.EXTRACT, fields=[" 姓名 ", "身份证号"])
        == "提取图片中的: ['姓名','身份证号'] 的字段内容，并按照 JSON 格式返回。"
    )
    assert build_prompt(Task.EXTRACT, fields=["Invoice No", "Total (USD)"], prompt_language="en") == (
        "Extract the content of the fields: ['Invoice No','Total (USD)'] from the image "
        "and return it in JSON format."
    )


def test_extract_fields_deduplicated_in_order() -> None:
    assert build_prompt(Task.EXTRACT, fields=["b", "a", "b "]).count("'b'") == 1


def test_translate_prompts() -> None:
    into_en = build_prompt(Task.TRANSLATE, target_language="en")
    assert into_en == (
        "先提取文字，再将文字内容翻译为英文。若是文档，则其中页眉、页脚忽略。"
        "公式用latex格式表示，表格用html格式表示。"
    )
    assert build_prompt(Task.TRANSLATE, target_language="zh") == into_en.replace("英文", "中文")
    en = build_prompt(Task.TRANSLATE, target_language="zh", prompt_language="en")
    assert en.startswith(
        "First extract the text, then translate the text content into Chinese. If it is a document"
    )
    assert build_prompt(Task.TRANSLATE, target_language="EN-us", prompt_language="zh_CN") == into_en


def test_vqa_prompt_is_the_question() -> None:
    assert build_prompt(Task.VQA, question="  发票的开票日期是哪天？ ") == "发票的开票日期是哪天？"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"task": Task.EXTRACT}, "fields"),
        ({"task": Task.EXTRACT, "fields": ["  "]}, "fields"),
        ({"task": Task.EXTRACT, "fields": ["a\nb"]}, "fields"),
        ({"task": Task.EXTRACT, "fields": ["it's"]}, "fields"),
        ({"task": Task.EXTRACT, "fields": ['say "x"']}, "fields"),
        ({"task": Task.EXTRACT, "fields": ["list[0]"]}, "fields"),
        ({"task": Task.EXTRACT, "fields": ["x" * 101]}, "fields"),
        ({"task": Task.EXTRACT, "fields": [f"f{i}" for i in range(51)]}, "fields"),
        ({"task": Task.VQA}, "question"),
        ({"task": Task.VQA, "question": "   "}, "question"),
        ({"task": Task.TRANSLATE, "target_language": "fr"}, "target_language"),
        ({"task": Task.TEXT, "prompt_language": "jp"}, "prompt_language"),
    ],
)
def test_build_prompt_rejects(kwargs: dict, param: str) -> None:
    task = kwargs.pop("task")
    with pytest.raises(InvalidRequest) as info:
        build_prompt(task, **kwargs)
    assert info.value.param == param
    assert info.value.status == 400


def test_field_limits_are_inclusive() -> None:
    prompt = build_prompt(Task.EXTRACT, fields=["x" * 100] + [f"f{i}" for i in range(49)])
    assert prompt.count("','") == 49


def test_single_key_prompt() -> None:
    assert build_single_key_prompt(" 发票号码 ") == "输出 发票号码 的值。"
    assert build_single_key_prompt("Invoice No", prompt_language="en") == "Output the value of Invoice No."
    with pytest.raises(InvalidRequest):
        build_single_key_prompt("")


@pytest.mark.parametrize("task", SIMPLE_TASKS)
@pytest.mark.parametrize("lang", ["zh", "en"])
def test_match_official_prompts(task: Task, lang: str) -> None:
    prompt = build_prompt(task, prompt_language=lang)
    assert match_prompt(prompt) == PromptMatch(task, prompt_language=lang)
    assert match_prompt(f"\n  {prompt}  \n").task is task


def test_match_tolerates_spacing_and_punctuation() -> None:
    squeezed = PROMPTS[Task.DOCUMENT]["zh"].replace(" ", "")
    assert match_prompt(squeezed).task is Task.DOCUMENT
    assert match_prompt("把图中的表格解析为HTML").task is Task.TABLE
    assert match_prompt("提取图中的文字.").task is Task.TEXT
    assert match_prompt("Extract  the text in the image。").task is Task.TEXT


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("target", ["zh", "en"])
def test_match_translation_round_trip(lang: str, target: str) -> None:
    prompt = build_prompt(Task.TRANSLATE, target_language=target, prompt_language=lang)
    assert match_prompt(prompt) == PromptMatch(Task.TRANSLATE, target_language=target, prompt_language=lang)


def test_match_translation_short_form_and_other_languages() -> None:
    assert match_prompt("先提取文字，再将文字内容翻译为英文。").target_language == "en"
    assert match_prompt("先提取文字，再将文字内容翻译为日语。").target_language == "ja"
    # Extra instructions after the prompt make it a question the model must read as written.
    assert match_prompt("先提取文字，再将文字内容翻译为英文。然后总结要点。").task is Task.VQA


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_match_extract_round_trip(lang: str) -> None:
    fields = ("姓名", "Total (USD)", "出生日期")
    m = match_prompt(build_prompt(Task.EXTRACT, fields=fields, prompt_language=lang))
    assert m == PromptMatch(Task.EXTRACT, fields=fields, prompt_language=lang)


def test_match_extract_variants() -> None:
    spaced = (
        'Extract the content of the fields: ["Invoice No", "Date"] from the image '
        "and return it in JSON format."
    )
    assert match_prompt(spaced).fields == ("Invoice No", "Date")
    fullwidth = "提取图片中的：['姓名', '性别'] 的字段内容,并按照JSON格式返回"
    assert match_prompt(fullwidth).fields == ("姓名", "性别")
    assert match_prompt("提取图片中的: ['key1','key2', ...] 的字段内容，并按照 JSON 格式返回。").fields == (
        "key1",
        "key2",
    )
    assert match_prompt("提取图片中的: [单位, 金额] 的字段内容，并按照 JSON 格式返回。").fields == (
        "单位",
        "金额",
    )


def test_match_single_key() -> None:
    assert match_prompt("输出 发票号码 的值。") == PromptMatch(
        Task.EXTRACT, fields=("发票号码",), prompt_language="zh", single_key=True
    )
    assert match_prompt("输出发票号码的值").fields == ("发票号码",)
    m = match_prompt("Output the value of Total (USD).")
    assert (m.task, m.fields, m.single_key, m.prompt_language) == (Task.EXTRACT, ("Total (USD)",), True, "en")
    assert match_prompt('Output the value of "Invoice No".').fields == ("Invoice No",)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "这张发票的总金额是多少？",
        "What is the date on this receipt?",
        "提取图中的文字，并翻译成法语。",
    ],
)
def test_unrecognised_is_vqa(text: str) -> None:
    assert match_prompt(text) == PromptMatch(Task.VQA)


@pytest.mark.parametrize(
    "text",
    [
        "Output the value of a" + " " * 50_000 + "b",
        "输出a" + " " * 50_000 + "b",
        "提取图片中的" + " " * 50_000 + "x",
        "Extract the content of the fields" + " " * 50_000 + "x",
        "提取图片中的: [a] 的字段内容" + " " * 50_000 + "x",
        "提取图片中的: [" + "]" * 50_000,
    ],
)
def test_match_prompt_is_fast_on_hostile_input(text: str) -> None:
    # Prompts are user text: a regex that backtracks quadratically would stall the event loop.
    start = time.perf_counter()
    assert match_prompt(text).task is Task.VQA
    assert time.perf_counter() - start < 0.5


@given(st.text(max_size=300))
def test_match_prompt_never_raises(text: str) -> None:
    assert isinstance(match_prompt(text).task, Task)


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("spotting", Task.SPOTTING),
        ("TEXT", Task.TEXT),
        (" Document ", Task.DOCUMENT),
        ("ocr", Task.TEXT),
        ("parse", Task.DOCUMENT),
        ("Parsing", Task.DOCUMENT),
        ("markdown", Task.DOCUMENT),
        ("extraction", Task.EXTRACT),
        ("translation", Task.TRANSLATE),
        ("question", Task.VQA),
        ("QA", Task.VQA),
        ("detect", Task.SPOTTING),
        ("boxes", Task.SPOTTING),
    ],
)
def test_parse_task(name: str, task: Task) -> None:
    assert parse_task(name) is task


def test_parse_task_unknown_lists_valid_tasks() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_task("summarize")
    assert info.value.param == "task"
    for task in Task:
        assert task.value in info.value.message
