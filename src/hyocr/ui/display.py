"""Pure helpers for the UI: boxes drawn on pages, results formatted for display.

No Gradio here, so everything is unit-tested on plain values (tests/unit/test_ui_display.py).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable

from PIL import Image, ImageDraw

from ..engines.base import EngineInfo
from ..engines.registry import engines_for
from ..hunyuan.prompts import TASK_DESCRIPTIONS, V15_TASKS
from ..types import PageResult, Task, TextBlock

PREVIEW_MAX_SIDE = 1600  # pages are shown (and kept per session) at most this large
BOX_COLOUR = (225, 29, 72)  # rose-600: visible on white paper and on photos

TASK_LABELS: dict[Task, str] = {
    Task.SPOTTING: "Text spotting: lines with boxes",
    Task.TEXT: "Plain text",
    Task.DOCUMENT: "Document parsing to Markdown",
    Task.EXTRACT: "Field extraction to JSON",
    Task.TRANSLATE: "Translation",
    Task.FORMULA: "Formula to LaTeX",
    Task.TABLE: "Table to HTML",
    Task.CHART: "Chart to Markdown / Mermaid",
    Task.SUBTITLES: "Subtitles of a video frame",
    Task.VQA: "Ask a question",
    Task.SPOTTING_JSON: "Lines with boxes as JSON (HunyuanOCR 1.5)",
    Task.LAYOUT: "Layout regions (HunyuanOCR 1.5)",
}

# Which result tab a finished task opens on.
RESULT_TAB: dict[Task, str] = {
    Task.DOCUMENT: "rendered",
    Task.TABLE: "rendered",
    Task.FORMULA: "rendered",
    Task.CHART: "rendered",
    Task.EXTRACT: "fields",
}

# HunyuanOCR 1.0 spotting runs: "text(x1,y1),(x2,y2)". Shown as line breaks while streaming.
_COORDS = re.compile(r"\(\s*\d+\s*,\s*\d+\s*\)\s*,\s*\(\s*\d+\s*,\s*\d+\s*\)")
_MERMAID = re.compile(r"^\s*(graph|flowchart|sequenceDiagram|classDiagram|stateDiagram|gantt|pie|mindmap)\b")
_MATH_FENCES = (("$$", "$$"), ("\\[", "\\]"), ("$", "$"))


def preview(image: Image.Image, max_side: int = PREVIEW_MAX_SIDE) -> tuple[Image.Image, float]:
    """A copy at most ``max_side`` px on its long side, and the scale applied (<= 1)."""
    scale = min(1.0, max_side / max(image.width, image.height))
    if scale >= 1.0:
        return image.copy(), 1.0
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS), scale


def draw_boxes(image: Image.Image, blocks: Iterable[TextBlock], *, max_side: int = PREVIEW_MAX_SIDE,
               colour: tuple[int, int, int] = BOX_COLOUR, size: tuple[int, int] | None = None) -> Image.Image:
    """The page (downscaled to ``max_side``) with each block's quad or box outlined over a light tint.

    Boxes are in pixels of the original page (``size``, when ``image`` was reduced from it), so they are
    scaled with it; box-less blocks (model text without coordinates) are skipped. The input image is not
    modified.
    """
    page, scale = preview(image.convert("RGB"), max_side)
    sx = sy = scale
    if size is not None and size[0] and size[1]:  # per axis: a reduction to a 32-pixel grid moves the ratio
        sx, sy = scale * image.width / size[0], scale * image.height / size[1]
    overlay = Image.new("RGBA", page.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    width = max(2, round(max(page.size) / 400))
    for block in blocks:
        if block.polygon and len(block.polygon) >= 3:
            points = [(x * sx, y * sy) for x, y in block.polygon]
        elif block.box is not None:
            x1, y1, x2, y2 = block.box
            points = [(x1 * sx, y1 * sy), (x2 * sx, y1 * sy), (x2 * sx, y2 * sy), (x1 * sx, y2 * sy)]
        else:
            continue
        draw.polygon(points, fill=(*colour, 40))
        draw.line([*points, points[0]], fill=(*colour, 255), width=width, joint="curve")
    return Image.alpha_composite(page.convert("RGBA"), overlay).convert("RGB")


def stream_display(task: Task, raw: str) -> str:
    """Text to show while a page streams: spotting coordinates become line breaks."""
    if task is Task.SPOTTING:
        return "\n".join(line.strip() for line in _COORDS.sub("\n", raw).splitlines() if line.strip())
    return raw


def _strip_math_fence(latex: str) -> str:
    body = latex.strip()
    for start, end in _MATH_FENCES:
        if body.startswith(start) and body.endswith(end) and len(body) > len(start) + len(end):
            return body[len(start) : -len(end)].strip()
    return body


def rendered_markdown(task: Task, page: PageResult) -> str:
    """Markdown for the "Rendered" view: documents as they are, HTML tables, LaTeX as display math."""
    if task is Task.DOCUMENT:
        return page.markdown or page.text
    if task is Task.FORMULA:
        return "$$\n" + _strip_math_fence(page.text) + "\n$$" if page.text else ""
    if task is Task.CHART and _MERMAID.match(page.text) and "```" not in page.text:
        return "```mermaid\n" + page.text.strip() + "\n```"
    return page.text


def fields_view(page: PageResult) -> dict | None:
    """The JSON view: extracted fields, or why there are none (with what the model wrote)."""
    if page.fields is not None:
        return page.fields
    if page.error:
        return {"error": page.error, "model_output": page.raw_text}
    return None


def task_choices(info: EngineInfo) -> list[tuple[str, str]]:
    """(label, value) for every task; those this engine cannot run say what they need."""
    order = [Task.SPOTTING, Task.TEXT, Task.DOCUMENT, Task.EXTRACT, Task.TRANSLATE, Task.TABLE,
             Task.FORMULA, Task.CHART, Task.SUBTITLES, Task.VQA, Task.SPOTTING_JSON, Task.LAYOUT]
    return [(TASK_LABELS[t] + _unavailable(t, info), t.value) for t in order]


def _unavailable(task: Task, info: EngineInfo) -> str:
    if task in info.tasks:
        return ""
    return "  (needs a 1.5 checkpoint)" if info.follows_prompts and task in V15_TASKS else "  (needs HunyuanOCR)"


def task_note(task: Task, info: EngineInfo) -> str:
    """What the task gives, and, when this engine cannot run it, why and what to start instead."""
    note = TASK_DESCRIPTIONS[task]
    if task in info.tasks:
        return note
    able = " or ".join(f"`--engine {name}`" for name in engines_for(task)) or "a vision-language engine"
    runs = ", ".join(sorted(t.value for t in info.tasks))
    return (
        f"{note}\n\n**Not available on this server.** The `{info.name}` engine is a text detector and "
        f"recogniser: it reads text and boxes ({runs}) but does not read instructions. This task needs "
        f"the HunyuanOCR vision-language model: start hyocr with {able}."
    )


def engine_badge(info: EngineInfo) -> str:
    tasks = ", ".join(t.value for t in Task if t in info.tasks)
    return (f'<span class="hy-badge">engine <b>{html.escape(info.name)}</b></span>'
            f'<span class="hy-badge">model <b>{html.escape(info.model)}</b></span>'
            f'<span class="hy-badge">tasks <b>{html.escape(tasks)}</b></span>')


def status_html(message: str, kind: str = "info") -> str:
    """A one-line status; ``kind`` is info | busy | ok | warn | error (styled by the UI's CSS)."""
    icon = {"busy": "⏳", "ok": "✓", "warn": "⚠", "error": "✖"}.get(kind, "")
    role = ' role="alert"' if kind == "error" else ""
    return (f'<div class="hy-status hy-{kind}"{role}>{icon + " " if icon else ""}'
            f"{html.escape(message)}</div>")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} ms" if value < 10_000 else f"{value / 1000:.1f} s"


def stats_html(body: dict, *, page: int | None = None) -> str:
    """Timings, token counts and what ran, from a /v1/ocr result body (the JSON download)."""
    timings, usage = body["timings"], body["usage"]
    pages = body["pages"]
    chips = [("ran", f"{body['engine']} · {body['task']}"), ("pages", str(len(pages)))]
    if page is not None and pages[page]["blocks"]:
        chips.append(("boxes", str(len(pages[page]["blocks"]))))
    chips += [
        ("first text", _ms(timings.get("first_text_ms"))),
        ("inference", _ms(timings.get("engine_ms"))),
        ("total", _ms(timings.get("total_ms"))),
    ]
    if usage["total_tokens"]:
        chips.append(("tokens", f"{usage['prompt_tokens']} in · {usage['completion_tokens']} out"))
    else:
        chips.append(("tokens", "n/a (a detector)"))
    reasons = {p["finish_reason"] for p in pages} - {"stop"}
    if reasons:
        chips.append(("finish", ", ".join(sorted(reasons))))
    return '<div class="hy-stats">' + "".join(
        f'<span class="hy-chip"><i>{html.escape(k)}</i> {html.escape(v)}</span>' for k, v in chips
    ) + "</div>"


def api_snippet(task: Task, base_url: str) -> str:
    """The same request made with curl against /v1/ocr, as a Markdown code block."""
    extra = {
        Task.EXTRACT: " -F fields='name,ID number'",
        Task.TRANSLATE: " -F language=en",
        Task.VQA: " -F question='What is the total?'",
    }.get(task, "")
    return f"```bash\ncurl -s -F file=@page.png -F task={task.value}{extra} \\\n  {base_url}/v1/ocr\n```"
