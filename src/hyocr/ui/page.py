"""The page's layout: the input column (upload, task and its options, Run/Stop, examples) and the result
column (status, page selector, page image, result tabs), built inside the app's ``gr.Blocks``.

The components that events read or write are handed back as ``Widgets``: Gradio wires an event to
component objects, so the handlers (ui/handlers.py, ui/reading.py) need them, not just the layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines.base import EngineInfo
from ..types import Task
from . import display
from ._gradio import gr

if TYPE_CHECKING:
    from ..config import Settings

INSTRUCTIONS = """\
**1.** Upload an image (PNG, JPEG, WebP, BMP or TIFF; several files are read as pages) or a PDF, or pick an example.
**2.** Choose a task. **3.** Press **Run**: text appears as it is read, then boxes, tables and fields.
The same service answers the HTTP API: see [/docs](/docs).
"""
# File name extensions the upload box offers, per IMAGE_FORMATS entry (PDF is always offered).
_EXTENSIONS = {"PNG": ("png",), "JPEG": ("jpg", "jpeg"), "WEBP": ("webp",), "BMP": ("bmp",),
               "TIFF": ("tif", "tiff"), "GIF": ("gif",), "JPEG2000": ("jp2", "j2k")}
_LATEX = [{"left": "$$", "right": "$$", "display": True}, {"left": "$", "right": "$", "display": False}]


@dataclass(frozen=True)
class Widgets:
    """The page's components that events read or write."""

    state: gr.State  # the finished run: result, its /v1/ocr body, page previews
    # the input column
    files: gr.File
    pages: gr.Textbox
    task: gr.Dropdown
    model: gr.Dropdown
    note: gr.Markdown
    fields: gr.Textbox
    schema: gr.Textbox
    language: gr.Radio
    question: gr.Textbox
    max_tokens: gr.Slider
    run: gr.Button
    stop: gr.Button
    download: gr.DownloadButton
    snippet: gr.Markdown
    # the result column
    status: gr.HTML
    nav: gr.Radio
    image: gr.Image
    tabs: gr.Tabs
    text: gr.Textbox
    rendered: gr.Markdown
    fields_json: gr.JSON
    body_json: gr.JSON
    stats: gr.HTML

    @property
    def run_inputs(self) -> list[Any]:
        """What Run reads, in the order of ``Reading.run``'s parameters."""
        return [self.files, self.task, self.fields, self.schema, self.language, self.question, self.max_tokens,
                self.model, self.pages]

    @property
    def view(self) -> list[Any]:
        """What shows one page of a finished run (the page selector switches all of them)."""
        return [self.image, self.text, self.rendered, self.fields_json, self.body_json, self.stats]


def lay_out(info: EngineInfo, settings: Settings, max_pages: int, examples: dict[str, Path],
            base_url: str) -> Widgets:
    """Build the page (call inside ``gr.Blocks``) and return its live components."""
    state = gr.State(None)
    gr.HTML('<div class="hy-header"><h1>hyocr <span>HunyuanOCR in your browser</span></h1>'
            f'<div class="hy-badges">{display.engine_badge(info)}</div></div>')
    gr.Markdown(INSTRUCTIONS, elem_classes="hy-steps")
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=340):
            inputs = _input_column(info, settings, max_pages, examples, base_url)
        with gr.Column(scale=3, min_width=420):
            results = _result_column()
    return Widgets(state=state, **inputs, **results)


def _input_column(info: EngineInfo, settings: Settings, max_pages: int, examples: dict[str, Path],
                  base_url: str) -> dict[str, Any]:
    extensions = sorted({f".{e}" for fmt in settings.image_formats for e in _EXTENSIONS.get(fmt, (fmt,))}
                        | {".pdf"})
    files = gr.File(label="Image or PDF", file_count="multiple", file_types=extensions, height=150,
                    elem_id="hy-files")
    pages = gr.Textbox(label="Pages", visible=False, elem_id="hy-pdf-pages",
                       placeholder=f"all (at most {max_pages}), or e.g. 1-3,8")
    task = gr.Dropdown(display.task_choices(info), value=Task.SPOTTING.value, label="Task", elem_id="hy-task")
    # LoRA adapters the engine serves are chosen by model name, as in the API.
    model = gr.Dropdown([info.model, *info.adapters], value=info.model, label="Model",
                        visible=bool(info.adapters), elem_id="hy-model")
    note = gr.Markdown(display.task_note(Task.SPOTTING, info), elem_id="hy-task-note", elem_classes="hy-note")
    # The task's own options, shown by the task selector (ui/handlers.py) when that task is chosen.
    fields = gr.Textbox(label="Fields to extract", placeholder="name, ID number, date of birth",
                        info="Comma-separated", visible=False)
    # Shown for extraction on an engine that constrains its output (handlers.py)
    schema = gr.Textbox(label="JSON Schema (optional, instead of fields)", lines=4, max_lines=16, visible=False,
                        placeholder='{"type": "object", "properties": {"name": {"type": "string"}}}',
                        info="The output is constrained to it and validated; its properties are the fields",
                        elem_id="hy-schema")
    language = gr.Radio([("English", "en"), ("Chinese 中文", "zh")], value="en", label="Translate into",
                        visible=False)
    question = gr.Textbox(label="Question", placeholder="What is the total amount?", visible=False)
    # Only a language model generates tokens; a detector's output has no length to cap.
    max_tokens = gr.Slider(16, settings.max_tokens_limit, value=settings.default_max_tokens, step=16,
                           label="Max new tokens per page", visible=info.follows_prompts)
    with gr.Row():
        run = gr.Button("Run", variant="primary", elem_id="hy-run", scale=3)
        stop = gr.Button("Stop", variant="secondary", scale=1)
    download = gr.DownloadButton("Download the JSON result", visible=False, size="md", elem_id="hy-download")
    gr.Examples(_example_rows(examples, info), inputs=[files, task, fields],
                label="Examples (drawn at start-up)", example_labels=["ID card", "Invoice"])
    with gr.Accordion("The same request with the API", open=False):
        snippet = gr.Markdown(display.api_snippet(Task.SPOTTING, base_url))
    return {"files": files, "pages": pages, "task": task, "model": model, "note": note, "fields": fields,
            "schema": schema, "language": language, "question": question, "max_tokens": max_tokens, "run": run, "stop": stop,
            "download": download, "snippet": snippet}


def _result_column() -> dict[str, Any]:
    status = gr.HTML(display.status_html("Upload an image and press Run."), elem_id="hy-status")
    nav = gr.Radio([], label="Pages", type="index", visible=False, elem_id="hy-pages")
    image = gr.Image(label="Page", type="pil", format="png", interactive=False, height=420,
                     buttons=["download", "fullscreen"], elem_id="hy-image")
    with gr.Tabs(selected="text") as tabs:  # tab ids: display.RESULT_TAB
        with gr.Tab("Text", id="text"):
            text = gr.Textbox(show_label=False, lines=10, max_lines=24, buttons=["copy"],
                              placeholder="Recognised text streams here.", elem_id="hy-text")
        with gr.Tab("Rendered", id="rendered"):
            rendered = gr.Markdown(latex_delimiters=_LATEX, min_height=120, elem_id="hy-rendered",
                                   elem_classes="hy-rendered")
        with gr.Tab("Fields", id="fields"):
            fields_json = gr.JSON(show_label=False, open=True, elem_id="hy-fields")
        with gr.Tab("JSON", id="json"):
            body_json = gr.JSON(show_label=False, elem_id="hy-json")
    stats = gr.HTML(elem_id="hy-stats")
    return {"status": status, "nav": nav, "image": image, "tabs": tabs, "text": text, "rendered": rendered,
            "fields_json": fields_json, "body_json": body_json, "stats": stats}


def _example_rows(examples: dict[str, Path], info: EngineInfo) -> list[list[Any]]:
    """The card for extraction and the invoice for parsing when the engine can; else spotting."""
    card, invoice = [str(examples["id-card"])], [str(examples["invoice"])]
    if Task.EXTRACT in info.tasks:
        return [[card, Task.EXTRACT.value, "name, ID number, date of birth, expiry date"],
                [invoice, Task.DOCUMENT.value, ""]]
    return [[card, Task.SPOTTING.value, ""], [invoice, Task.SPOTTING.value, ""]]
