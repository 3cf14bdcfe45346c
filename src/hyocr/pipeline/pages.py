"""Raw engine output -> one structured page: the post-processing rules, as pure functions.

Used by the service for /v1/ocr and the OpenAI routes, and by the web UI on the text it streamed, so
every path turns the same output into the same page.
"""

from __future__ import annotations

from ..hunyuan import extraction, versions
from ..hunyuan.layout import parse_layout
from ..hunyuan.markdown import markdown_from_document
from ..hunyuan.spotting import parse_spotting
from ..types import FinishReason, PageImage, PageResult, StructuredOutput, Task, TextBlock, Usage
from . import postprocess
from . import structured as constraints


def cut_loops(text: str, finish: FinishReason, generated: bool,
              rules: versions.ModelVersion = versions.V1_5) -> tuple[str, FinishReason]:
    """Cut a looping tail off generated text, and say so in the finish reason.

    When the loop guard stopped the stream, the tail is cut by the guard's own rule. Otherwise the
    authors' clean-up of the model's version applies: only long outputs are checked (1.0: 8000 characters,
    1.5: 2000), so short legitimate runs ("-----", "0000000000" in forms) are never cut. Text read by a detector (rapidocr) is never touched.
    """
    if not generated:
        return text, finish
    if finish is FinishReason.REPETITION:
        return postprocess.trim_repetition(text, min_span=postprocess.LOOP_MIN_SPAN)[0], finish
    cut, trimmed = postprocess.trim_repetition(text, min_length=rules.trim_min_chars,
                                               min_repeats=rules.trim_min_repeats)
    return cut, (FinishReason.REPETITION if trimmed and finish is FinishReason.STOP else finish)


def build_page(
    task: Task,
    page: PageImage,
    raw: str,
    blocks: tuple[TextBlock, ...],
    finish: FinishReason,
    usage: Usage,
    fields: tuple[str, ...] = (),
    *,
    trim_loops: bool = True,
    single_key: bool = False,
    structured: StructuredOutput | None = None,
    rules: versions.ModelVersion = versions.V1_5,
) -> PageResult:
    """Raw engine output -> a structured page (pure; the post-processing rules live here).

    ``trim_loops``: whether the text was generated (and so may loop); see ``cut_loops``. ``structured``: the
    schema an extraction was decoded under: its fields are the whole validated object, or the page says why not.
    """
    text, finish = cut_loops(raw, finish, trim_loops, rules)
    markdown = values = error = None
    if task in (Task.SPOTTING, Task.SPOTTING_JSON):
        if not blocks:
            blocks = tuple(parse_spotting(text, page.width, page.height))
        text = "\n".join(b.text for b in blocks)
    elif task is Task.LAYOUT:
        blocks = tuple(parse_layout(text, page.width, page.height))
        text = "\n".join(b.text for b in blocks if b.text)
    elif task is Task.DOCUMENT:
        markdown = markdown_from_document(text)
        text = markdown
    elif task is Task.EXTRACT and structured is not None:
        values, error = constraints.parse_output(text, structured, complete=finish is FinishReason.STOP)
    elif task is Task.EXTRACT and single_key and len(fields) == 1:
        values = {fields[0]: text.strip()}
    elif task is Task.EXTRACT:
        parsed, error = extraction.extract_json(text)
        if error is None:
            values = extraction.fields_from_json(parsed, fields)
        else:
            error = f"the model's output is not valid JSON: {error}"
    return PageResult(
        index=page.index,
        width=page.width,
        height=page.height,
        text=text.strip(),
        blocks=blocks,
        finish_reason=finish,
        markdown=markdown,
        fields=values,
        error=error,
        raw_text=raw,
        usage=usage,
    )
