"""The UI's pure helpers: boxes drawn on pages, results formatted for display, example images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from hyocr.engines.base import EngineInfo
from hyocr.engines.registry import ALL_TASKS, OCR_ONLY_TASKS
from hyocr.types import PageResult, Task, TextBlock
from hyocr.ui import display
from hyocr.ui.examples import id_card, invoice, write_examples

RAPID = EngineInfo("rapidocr", "rapidocr-pp-ocrv6", OCR_ONLY_TASKS, follows_prompts=False)
VLM = EngineInfo("vllm", "tencent/HunyuanOCR", ALL_TASKS, follows_prompts=True)


def _box_pixels(image: Image.Image) -> np.ndarray:
    """Mask of pixels in the outline colour."""
    px = np.asarray(image.convert("RGB"), dtype=int)
    return np.abs(px - display.BOX_COLOUR).max(axis=2) < 30


def test_boxes_are_outlined_where_the_blocks_are_and_nowhere_else():
    page = Image.new("RGB", (400, 300), "white")
    drawn = display.draw_boxes(page, [TextBlock("a", box=(50, 40, 200, 90)), TextBlock("no box")])
    mask = _box_pixels(drawn)
    ys, xs = np.nonzero(mask)
    assert drawn.size == (400, 300) and mask.sum() > 300
    assert xs.min() >= 47 and xs.max() <= 203 and ys.min() >= 37 and ys.max() <= 93
    assert drawn.getpixel((120, 65)) != (255, 255, 255)  # the inside is tinted ...
    assert drawn.getpixel((300, 200)) == (255, 255, 255)  # ... the rest of the page untouched
    assert page.getpixel((50, 40)) == (255, 255, 255)  # and the input image is not modified


def test_polygons_are_drawn_as_quads():
    page = Image.new("RGB", (400, 400), "white")
    diamond = ((200.0, 50.0), (350.0, 200.0), (200.0, 350.0), (50.0, 200.0))
    mask = _box_pixels(display.draw_boxes(page, [TextBlock("x", box=(50, 50, 350, 350), polygon=diamond)]))
    assert mask[50:54, 198:203].any() and mask[198:203, 50:54].any()  # the tips
    assert not mask[50:60, 50:60].any()  # not the bounding box's corner


def test_large_pages_are_downscaled_with_their_boxes():
    page = Image.new("RGB", (4000, 2000), "white")
    drawn = display.draw_boxes(page, [TextBlock("a", box=(2000, 1000, 3000, 1500))], max_side=1000)
    assert drawn.size == (1000, 500)
    ys, xs = np.nonzero(_box_pixels(drawn))
    assert abs(xs.min() - 500) <= 3 and abs(xs.max() - 750) <= 3 and abs(ys.min() - 250) <= 3


def test_boxes_of_a_page_reduced_for_the_engine_are_drawn_in_the_uploads_pixels():
    # The service kept a 2000x1000 copy of a 4000x2000 upload; boxes are in the upload's pixels.
    reduced = Image.new("RGB", (2000, 1000), "white")
    drawn = display.draw_boxes(reduced, [TextBlock("a", box=(2000, 1000, 3000, 1500))], max_side=1000,
                              size=(4000, 2000))
    ys, xs = np.nonzero(_box_pixels(drawn))
    assert abs(xs.min() - 500) <= 3 and abs(xs.max() - 750) <= 3 and abs(ys.min() - 250) <= 3


def test_preview_keeps_small_images_and_scales_large_ones():
    small, scale = display.preview(Image.new("RGB", (300, 200)))
    assert small.size == (300, 200) and scale == 1.0
    big, scale = display.preview(Image.new("RGB", (3200, 800)), 1600)
    assert big.size == (1600, 400) and scale == 0.5


def test_streamed_spotting_text_shows_lines_without_coordinates():
    raw = "NAME: JOHN(58,262),(393,325)ID 4201(58,400),(500,460)BORN"
    assert display.stream_display(Task.SPOTTING, raw) == "NAME: JOHN\nID 4201\nBORN"
    assert display.stream_display(Task.TEXT, raw) == raw


def _page(task: Task, text: str, **kw) -> PageResult:
    return PageResult(0, 100, 100, text, **kw)


@pytest.mark.parametrize(
    ("task", "text", "expected"),
    [
        (Task.FORMULA, "$$E=mc^2$$", "$$\nE=mc^2\n$$"),
        (Task.FORMULA, "\\[ \\frac{a}{b} \\]", "$$\n\\frac{a}{b}\n$$"),
        (Task.FORMULA, "x^2", "$$\nx^2\n$$"),
        (Task.TABLE, "<table><tr><td>1</td></tr></table>", "<table><tr><td>1</td></tr></table>"),
        (Task.CHART, "graph TD\nA-->B", "```mermaid\ngraph TD\nA-->B\n```"),
        (Task.CHART, "| a | b |\n|---|---|", "| a | b |\n|---|---|"),
        (Task.TEXT, "plain", "plain"),
    ],
)
def test_rendered_view_per_task(task, text, expected):
    assert display.rendered_markdown(task, _page(task, text)) == expected


def test_documents_render_their_markdown():
    page = _page(Task.DOCUMENT, "# T", markdown="# Title\n\n<table></table>")
    assert display.rendered_markdown(Task.DOCUMENT, page) == "# Title\n\n<table></table>"


def test_fields_view_shows_fields_or_why_not():
    assert display.fields_view(_page(Task.EXTRACT, "", fields={"name": "张三"})) == {"name": "张三"}
    bad = display.fields_view(_page(Task.EXTRACT, "oops", error="not JSON", raw_text="oops"))
    assert bad == {"error": "not JSON", "model_output": "oops"}
    assert display.fields_view(_page(Task.TEXT, "x")) is None


def test_task_choices_mark_what_the_engine_cannot_run():
    rapid = {v: label for label, v in display.task_choices(RAPID)}
    assert len(rapid) == len(Task)
    assert "needs HunyuanOCR" not in rapid["spotting"] and "needs HunyuanOCR" not in rapid["text"]
    assert "needs HunyuanOCR" in rapid["document"] and "needs HunyuanOCR" in rapid["extract"]
    assert not any("needs" in label for label, _ in display.task_choices(VLM))


def test_task_note_explains_why_rapidocr_cannot_parse_documents():
    note = display.task_note(Task.DOCUMENT, RAPID)
    assert "Not available on this server" in note and "--engine vllm" in note and "--engine transformers" in note
    assert "spotting, text" in note
    assert display.task_note(Task.DOCUMENT, VLM) == "Document parsed to Markdown (tables as HTML, formulas as " \
        "LaTeX), no headers/footers."


def test_status_is_escaped_and_errors_are_alerts():
    html = display.status_html("bad <script>", "error")
    assert "&lt;script&gt;" in html and 'role="alert"' in html and "hy-error" in html
    assert 'role="alert"' not in display.status_html("fine", "ok")


def _body(**over) -> dict:
    body = {
        "engine": "vllm", "task": "document", "text": "x",
        "pages": [{"index": 0, "blocks": [], "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 96, "total_tokens": 908},
        "timings": {"first_text_ms": 85.2, "engine_ms": 1432.0, "total_ms": 12500.0},
    }
    body.update(over)
    return body


def test_stats_show_timings_tokens_and_unusual_finishes():
    stats = display.stats_html(_body(), page=0)
    assert "vllm · document" in stats and "85 ms" in stats and "1432 ms" in stats and "12.5 s" in stats
    assert "812 in · 96 out" in stats and "finish" not in stats
    cut = display.stats_html(_body(pages=[{"index": 0, "blocks": [], "finish_reason": "length"}]))
    assert "length" in cut
    none = display.stats_html(_body(usage={"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}))
    assert "n/a" in none


def test_api_snippet_matches_the_task():
    assert "task=extract -F fields=" in display.api_snippet(Task.EXTRACT, "http://h:1")
    assert "http://h:1/v1/ocr" in display.api_snippet(Task.SPOTTING, "http://h:1")


def test_example_images_are_drawn_with_text(tmp_path):
    for image in (id_card(), invoice()):
        grey = np.asarray(image.convert("L"))
        assert (grey < 80).mean() > 0.01  # dark text on a light page
    paths = write_examples(tmp_path / "a")
    assert set(paths) == {"id-card", "invoice"}
    assert all(p.stat().st_size < 150_000 for p in paths.values())
    again = write_examples(tmp_path / "b")  # same pictures, different files (see write_examples)
    assert paths["id-card"].read_bytes() != again["id-card"].read_bytes()


def test_examples_draw_without_any_system_font(monkeypatch, tmp_path):
    from hyocr.ui import examples

    monkeypatch.setattr(examples, "find_font", lambda names: None)  # Pillow's built-in font only
    grey = np.asarray(examples.id_card().convert("L"))
    assert (grey < 80).mean() > 0.005
