from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyocr.hunyuan.extraction import extract_json, fields_from_json
from hyocr.hunyuan.markdown import markdown_from_document
from hyocr.hunyuan.spotting import normalized_box_to_pixels, parse_spotting, to_spotting_text
from hyocr.pipeline.postprocess import LoopGuard, trim_repetition
from hyocr.types import TextBlock

# ---- spotting ------------------------------------------------------------------------------------


def test_parse_spotting_official_example_scales_to_pixels() -> None:
    blocks = parse_spotting("字符串1(312,22),(493,49)字符串2(401,0),(666,194)", 2000, 1000)
    assert blocks == [
        TextBlock("字符串1", (624.0, 22.0, 986.0, 49.0)),
        TextBlock("字符串2", (802.0, 0.0, 1332.0, 194.0)),
    ]


def test_parse_spotting_invoice_with_parentheses_and_newlines() -> None:
    raw = (
        "增值税专用发票(301,18),(699,52)\n"
        "发票号码：No 04521367(702,60),(953,84)\n"
        "Total (USD)(10,20),(30,40)\n"
        "f(x)=(a,b)(1,2),(3,4)\n"
        "合计金额（小写）¥1,280.00(512,900),(880,931)"
    )
    blocks = parse_spotting(raw, 1000, 1000)
    assert [b.text for b in blocks] == [
        "增值税专用发票",
        "发票号码：No 04521367",
        "Total (USD)",
        "f(x)=(a,b)",
        "合计金额（小写）¥1,280.00",
    ]
    assert blocks[2].box == (10.0, 20.0, 30.0, 40.0)
    assert blocks[3].box == (1.0, 2.0, 3.0, 4.0)


def test_parse_spotting_coordinates_inside_text_stay_text() -> None:
    blocks = parse_spotting("Item (1,2),(3,4)(100,200),(300,400)", 1000, 1000)
    assert blocks == [TextBlock("Item (1,2),(3,4)", (100.0, 200.0, 300.0, 400.0))]


def test_parse_spotting_orders_and_clamps() -> None:
    (block,) = parse_spotting("倒置(500,600),(100,1020)", 333, 777)
    x1, y1, x2, y2 = block.box
    assert (x1, x2) == (33.3, 166.5)
    assert (y1, y2) == (466.2, 777.0)


def test_parse_spotting_ref_quad_and_box() -> None:
    raw = (
        "<ref>姓名 张三</ref><quad>(100,50),(400,80)</quad>\n"
        "<ref>Amount (EUR)</ref><box>(500,500),(900,550)</box>"
        "<ref>旋转文字</ref><quad>(0,0),(100,0),(100,50),(0,50)</quad>"
        "<ref>无框</ref>"
    )
    blocks = parse_spotting(raw, 1000, 2000)
    assert [b.text for b in blocks] == ["姓名 张三", "Amount (EUR)", "旋转文字", "无框"]
    assert blocks[0].box == (100.0, 100.0, 400.0, 160.0)
    assert blocks[1].box == (500.0, 1000.0, 900.0, 1100.0)
    assert blocks[2].polygon == ((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0))
    assert blocks[2].box == (0.0, 0.0, 100.0, 100.0)
    assert blocks[3].box is None


def test_parse_spotting_json_form_in_fence() -> None:
    raw = (
        '```json\n[{"box": [100, 200, 300, 250], "text": " 发票代码 "}, {"text": "", "box": [1,2,3,4]},\n'
        ' {"text": "ID 4401", "box": "bad"}]\n```'
    )
    blocks = parse_spotting(raw, 500, 1000)
    assert blocks == [TextBlock("发票代码", (50.0, 200.0, 150.0, 250.0)), TextBlock("ID 4401")]


def test_parse_spotting_without_coordinates_keeps_text() -> None:
    assert parse_spotting("  Plain text (no boxes)\n第二行 ", 100, 100) == [
        TextBlock("Plain text (no boxes)\n第二行")
    ]
    assert parse_spotting("A(1,2),(3,4) trailing words", 1000, 1000)[-1] == TextBlock("trailing words")
    assert parse_spotting("   \n", 100, 100) == []


def test_parse_spotting_leading_bracket_is_not_json() -> None:
    blocks = parse_spotting("[1] Introduction(10,10),(500,40)", 1000, 1000)
    assert blocks == [TextBlock("[1] Introduction", (10.0, 10.0, 500.0, 40.0))]


@pytest.mark.parametrize(
    "raw", ["<ref>" * 20_000, "<ref>a</ref><quad>" * 10_000, "(1,2)," * 30_000, "{[" * 30_000]
)
def test_parse_spotting_is_fast_on_hostile_output(raw: str) -> None:
    start = time.perf_counter()
    blocks = parse_spotting(raw, 100, 100)
    assert all(b.text.strip() for b in blocks)
    assert time.perf_counter() - start < 1.5


def test_normalized_box_to_pixels() -> None:
    assert normalized_box_to_pixels((0, 0, 1000, 1000), 640, 480) == (0.0, 0.0, 640.0, 480.0)
    assert normalized_box_to_pixels((1, 1, 2, 2), 3, 3) == (0.0, 0.0, 0.01, 0.01)
    with pytest.raises(ValueError):
        normalized_box_to_pixels((0, 0, 1, 1), 0, 10)


def test_to_spotting_text_format() -> None:
    blocks = [TextBlock("Total (USD)", (64.0, 48.0, 320.0, 96.0)), TextBlock("no box")]
    assert to_spotting_text(blocks, 640, 480) == "Total (USD)(100,100),(500,200)no box\n"


_texts = st.text(alphabet="abcxyz 发票金额：¥.,-", min_size=1, max_size=20).map(str.strip).filter(bool)


@st.composite
def _blocks(draw: st.DrawFn) -> tuple[list[TextBlock], int, int]:
    width = draw(st.integers(1, 5000))
    height = draw(st.integers(1, 5000))
    out = []
    for _ in range(draw(st.integers(0, 6))):
        xs = sorted(draw(st.floats(0, width)) for _ in range(2))
        ys = sorted(draw(st.floats(0, height)) for _ in range(2))
        out.append(TextBlock(draw(_texts), (xs[0], ys[0], xs[1], ys[1])))
    return out, width, height


@given(_blocks())
def test_spotting_round_trip(case: tuple[list[TextBlock], int, int]) -> None:
    blocks, width, height = case
    parsed = parse_spotting(to_spotting_text(blocks, width, height), width, height)
    assert [b.text for b in parsed] == [b.text for b in blocks]
    for got, want in zip(parsed, blocks, strict=True):
        for g, w, size in zip(got.box, want.box, (width, height, width, height), strict=True):
            assert abs(g - w) <= size / 1000 + 0.01


@given(st.text(max_size=400), st.integers(1, 4000), st.integers(1, 4000))
def test_parse_spotting_never_raises(text: str, width: int, height: int) -> None:
    for block in parse_spotting(text, width, height):
        assert block.text and block.text == block.text.strip()
        if block.box is not None:
            x1, y1, x2, y2 = block.box
            assert 0 <= x1 <= x2 <= width and 0 <= y1 <= y2 <= height


# ---- repetition ----------------------------------------------------------------------------------


def test_trim_single_char_loop_in_long_output() -> None:
    text = "第一章 总则\n本合同由甲乙双方签订。" * 300 + "的" * 10_000
    trimmed, looped = trim_repetition(text)
    assert looped and trimmed == text[: -10_000 + 1]


def test_trim_sentence_loop_keeps_one_whole_sentence() -> None:
    text = "正文内容。" + "重复的句子在这里。" * 40
    assert trim_repetition(text) == ("正文内容。重复的句子在这里。", True)


def test_trim_drops_half_written_repeat() -> None:
    text = "Intro: " + "Hello world. " * 30 + "Hello wo"
    assert trim_repetition(text) == ("Intro: Hello world. ", True)


def test_trim_prefers_the_longest_loop() -> None:
    # The tail is also 12 dashes (a 1-char loop); the 15-char row loop covers more and wins.
    row = "合计 " + "-" * 12
    trimmed, looped = trim_repetition("表格\n" + row * 12)
    assert looped and trimmed == "表格\n" + row


def test_trim_table_row_loop() -> None:
    row = "<tr><td>合计</td><td>¥0.00</td></tr>\n"
    trimmed, looped = trim_repetition("<table>\n<tr><td>运费</td><td>¥12.00</td></tr>\n" + row * 15)
    assert looped and trimmed.endswith("¥12.00</td></tr>\n" + row)


def test_trim_respects_thresholds() -> None:
    assert trim_repetition("abc" + "xy" * 9) == ("abc" + "xy" * 9, False)
    assert trim_repetition("xy" * 20, min_length=100) == ("xy" * 20, False)
    assert trim_repetition("a" * 150, min_span=200) == ("a" * 150, False)
    assert trim_repetition("订单号：0000000000") == ("订单号：0", True)  # the official rule is that blunt


def test_trim_repetition_is_fast_on_100k() -> None:
    loops = [
        "的" * 100_000,
        "The same sentence again. " * 4_000,
        "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(100_000)),
    ]
    start = time.perf_counter()
    results = [trim_repetition(t)[1] for t in loops]
    assert results == [True, True, False]
    assert time.perf_counter() - start < 1.0


@settings(max_examples=200)
@given(st.text(alphabet="ab的。\n ", max_size=300), st.integers(2, 12), st.integers(1, 40))
def test_trim_output_is_prefix(text: str, min_repeats: int, max_unit: int) -> None:
    trimmed, looped = trim_repetition(text, min_repeats=min_repeats, max_unit=max_unit)
    assert text.startswith(trimmed)
    if looped:
        assert 0 < len(trimmed) < len(text)
    else:
        assert trimmed == text


# ---- LoopGuard -----------------------------------------------------------------------------------


def _feed_all(guard: LoopGuard, text: str, step: int) -> bool:
    return any(guard.feed(text[i : i + step]) for i in range(0, len(text), step))


def test_loop_guard_stops_on_repeated_sentence() -> None:
    guard = LoopGuard()
    body = "发票号码：04521367\n" + "重复的句子在这里。" * 1000
    assert _feed_all(guard, body, 3)
    assert guard.triggered and len(guard.text) < 600  # stopped early, not at the end
    assert guard.trimmed_text() == "发票号码：04521367\n重复的句子在这里。"


def test_loop_guard_stops_on_char_run() -> None:
    guard = LoopGuard(check_after=0, check_every=1)
    assert _feed_all(guard, "总计：" + "的" * 500, 1)
    assert 200 <= len(guard.text) - 3 <= 210
    assert guard.trimmed_text() == "总计：的"
    assert guard.feed("more") and guard.triggered  # stays triggered


def test_loop_guard_allows_short_runs_in_forms() -> None:
    guard = LoopGuard(check_after=0, check_every=1)
    form = "| 项目 | 金额 |\n|----------|----------|\n| 运费 | 0000000000 |\n" * 3 + "签字：__________"
    assert not _feed_all(guard, form, 2)
    assert guard.text == form and guard.trimmed_text() == form


def test_loop_guard_ignores_varied_text() -> None:
    text = "".join(f"第{i}行：编号 ID-{i * 37 % 1000:04d}，金额 {i * 13.5:.2f} 元。\n" for i in range(2000))
    guard = LoopGuard()
    start = time.perf_counter()
    assert not _feed_all(guard, text, 4)
    assert guard.text == text
    assert time.perf_counter() - start < 2.0


def test_loop_guard_respects_check_after() -> None:
    guard = LoopGuard(check_after=1000, check_every=10)
    assert not _feed_all(guard, "a" * 900, 10)
    assert guard.feed("a" * 200)


@settings(max_examples=200)
@given(st.lists(st.sampled_from(["ab", "的", "。", "\n", "xyz ", "a"]), max_size=300), st.integers(1, 8))
def test_loop_guard_trimmed_text_is_a_shorter_prefix(parts: list[str], every: int) -> None:
    guard = LoopGuard(max_unit=20, check_after=0, check_every=every, min_span=30)
    for part in parts:
        guard.feed(part)
    assert guard.text == "".join(parts)
    trimmed = guard.trimmed_text()
    assert guard.text.startswith(trimmed)
    assert (len(trimmed) < len(guard.text)) == guard.triggered


# ---- JSON ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            '{"姓名": "张三", "身份证号": "110101199003071234"}',
            {"姓名": "张三", "身份证号": "110101199003071234"},
        ),
        (
            '```json\n{"发票号码": "04521367", "金额": "¥1,280.00"}\n```',
            {"发票号码": "04521367", "金额": "¥1,280.00"},
        ),
        (
            'Here is the result:\n```\n{"Invoice No": "INV-001"}\n```\nHope it helps.',
            {"Invoice No": "INV-001"},
        ),
        ('提取结果如下 {"日期": "2024-01-05",} 以上。', {"日期": "2024-01-05"}),
        (
            "{'name': 'O\\'Brien', 'paid': True, 'note': None}",
            {"name": "O'Brien", "paid": True, "note": None},
        ),
        ('{姓名："李四"，"电话": "138-0000-0000"}', {"姓名": "李四", "电话": "138-0000-0000"}),
        (
            '{"items": [{"name": "笔(黑)", "qty": 2}, {"name": "纸", "qty": 1},]}',
            {"items": [{"name": "笔(黑)", "qty": 2}, {"name": "纸", "qty": 1}]},
        ),
        ('{"备注": "他说“你好”", "单位": "元"}', {"备注": "他说“你好”", "单位": "元"}),
        ('{"a": [1, 2, {"b": "cut off', {"a": [1, 2, {"b": "cut off"}]}),
        ('[note] see {"k": "v"}', {"k": "v"}),
        ('[{"a": 1}, {"b": 2}]', [{"a": 1}, {"b": 2}]),
    ],
)
def test_extract_json_lenient(raw: str, expected: object) -> None:
    assert extract_json(raw) == (expected, None)


@pytest.mark.parametrize("raw", ["", "没有找到相关字段。", "{not: json: at all}", "[" * 50_000])
def test_extract_json_failure_reason(raw: str) -> None:
    value, reason = extract_json(raw)
    assert value is None and isinstance(reason, str) and reason


@given(st.text(alphabet="{}[]\"':,， abc1TrueNone\n", max_size=200))
def test_extract_json_never_raises(text: str) -> None:
    value, reason = extract_json(text)
    assert (reason is None) or (value is None and reason)


def test_fields_from_json() -> None:
    value = {"姓名": "张三", "Invoice No": "INV-9", "extra": 1}
    assert fields_from_json(value, ["姓名", "invoice no", "性别"]) == {
        "姓名": "张三",
        "invoice no": "INV-9",
        "性别": None,
    }
    assert list(fields_from_json(value, ["性别", "姓名"])) == ["性别", "姓名"]
    merged = fields_from_json([{"a": None, "b": 2}, {"a": 1, "b": 3}, "junk"], ["a", "b"])
    assert merged == {"a": 1, "b": 2}
    assert fields_from_json("just text", ["a"]) == {"a": None}
    assert fields_from_json({"x": 1}, []) == {"x": 1}


def test_markdown_from_document() -> None:
    assert markdown_from_document("```markdown\n# 标题\n\n正文\n```") == "# 标题\n\n正文"
    inner = "# T\n\n```python\nprint(1)\n```\n"
    assert markdown_from_document(f"```md\n{inner}```") == inner.rstrip("\n")
    plain = "# 标题\n\n<table><tr><td>1</td></tr></table>\n"
    assert markdown_from_document(plain) == plain
    code_first = "```python\nx = 1\n```\n正文"
    assert markdown_from_document(code_first) == code_first
    assert markdown_from_document("```markdown\n# 被截断的输出") == "# 被截断的输出"
