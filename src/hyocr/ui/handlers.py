"""The page's quick events: the task selector, the upload check, the page selector of a finished run.

Run and Stop are in ui/reading.py; the helpers both need (reading uploads, error messages) are here.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from ..engines.base import EngineInfo
from ..errors import HyocrError
from ..pipeline.media import is_pdf
from ..pipeline.service import OcrService
from ..types import MediaInput, Task
from . import display
from ._gradio import gr
from .page import Widgets

CONCURRENCY = 16  # UI runs at once; the engine queues or batches them like API requests
GONE = ("The uploaded file is no longer on the server (uploads are kept for a while after their last use): "
        "upload it again.")
_READY = "Upload an image and press Run."


def wire_quick_events(w: Widgets, service: OcrService, base_url: str) -> None:
    """Gradio runs one event of a kind at a time unless told otherwise: quick ones are unlimited, the
    upload check (it decodes images) is bounded like runs."""
    info = service.engine.info

    def on_task(value: str) -> dict:
        return task_options(w, info, Task(value), base_url)

    async def on_upload(paths: list[str] | None) -> dict:
        return await check_upload(w, service, paths)

    def on_page(snapshot: dict | None, index: int | None) -> dict:
        return show_page(w, snapshot, index)

    w.task.change(on_task, w.task, [w.note, w.snippet, w.fields, w.schema, w.language, w.question],
                  api_visibility="private", concurrency_limit=None)
    w.files.change(on_upload, w.files, [w.image, w.pages, w.status], api_visibility="private",
                   concurrency_limit=CONCURRENCY)
    w.nav.change(on_page, [w.state, w.nav], w.view, api_visibility="private", show_progress="hidden",
                 concurrency_limit=None)


def task_options(w: Widgets, info: EngineInfo, chosen: Task, base_url: str) -> dict:
    """The chosen task's note, API snippet and own options (fields, target language, question)."""
    return {
        w.note: display.task_note(chosen, info),
        w.snippet: display.api_snippet(chosen, base_url),
        w.fields: gr.Textbox(visible=chosen is Task.EXTRACT),
        w.schema: gr.Textbox(visible=chosen is Task.EXTRACT and info.structured),
        w.language: gr.Radio(visible=chosen is Task.TRANSLATE),
        w.question: gr.Textbox(visible=chosen is Task.VQA),
    }


async def check_upload(w: Widgets, service: OcrService, paths: list[str] | None) -> dict:
    """Validate an upload as a run would (the service's own rules), so a bad file is named at once:
    the first page's preview, and the PDF pages box for a PDF."""
    if not paths:
        return {w.image: None, w.pages: gr.Textbox(visible=False), w.status: display.status_html(_READY)}
    touch(paths)
    try:
        media = await read_media(paths)
        seen = await service.preview(media)
    except HyocrError as exc:
        return {w.image: None, w.pages: gr.Textbox(visible=False),
                w.status: display.status_html(message(exc, [Path(p).name for p in paths]), "error")}
    except FileNotFoundError:
        return {w.image: None, w.pages: gr.Textbox(visible=False), w.status: display.status_html(GONE, "error")}
    first = seen.first
    if seen.pdf:  # a PDF, or a TIFF of several pages
        kind = "PDF" if isinstance(media[0].data, bytes) and is_pdf(media[0].data) else "TIFF"
        what = f"{seen.pages}-page {kind}"
    else:
        what = f"{seen.pages} pages" if seen.pages > 1 else f"{first.width}×{first.height} image"
    return {w.image: display.preview(first.image)[0], w.pages: gr.Textbox(visible=seen.pdf),
            w.status: display.status_html(f"{what} ready: choose a task and press Run.")}


def show_page(w: Widgets, snapshot: dict | None, index: int | None) -> dict:
    """One page of a finished run (``snapshot``: ui/reading.py) in the result views."""
    if not snapshot:
        return {}
    i = min(max(index or 0, 0), len(snapshot["previews"]) - 1)
    page = snapshot["result"].pages[i]
    return {
        w.image: snapshot["previews"][i],  # None: a PDF page that could not be rendered
        w.text: page.text or (f"[{page.error}]" if page.error else ""),
        w.rendered: display.rendered_markdown(snapshot["result"].task, page),
        w.fields_json: display.fields_view(page),
        w.body_json: snapshot["body"],
        w.stats: display.stats_html(snapshot["body"], page=i),
    }


async def read_media(paths: list[str]) -> tuple[MediaInput, ...]:
    """The uploaded files, named as the user named them (errors about a file carry that name)."""
    media = []
    for p in paths:
        media.append(MediaInput(await asyncio.to_thread(Path(p).read_bytes), param=Path(p).name))
    return tuple(media)


def touch(paths: list[str]) -> None:
    """An upload's age (Gradio's expiry and the upload space's eviction go by ctime) counts from its last use."""
    for p in paths:
        try:
            os.utime(p)
        except OSError:
            pass


def message(exc: HyocrError, files: list[str]) -> str:
    """An error's public message, naming the file it is about; internal errors say only that."""
    if not exc.public:
        return "The engine failed on this request; the server log has the details."
    if exc.param in files:  # media errors carry the file's name (MediaInput.param)
        return f"{exc.param}: {exc.message}"
    return exc.message[:1].upper() + exc.message[1:]
