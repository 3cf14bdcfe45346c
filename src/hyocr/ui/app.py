"""The web UI: a Gradio app on the service's own ``OcrService``, mounted at /ui by ``build_app``.

There is no second path to the engine: a run is ``service.read`` with its text streamed per page
(``runner.stream_run``), and the JSON download is the /v1/ocr body (``api.bodies.ocr_body``).
Gradio is imported only here, and only when the UI is enabled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

# This module is the UI's launch path (imported only when the UI is on): no telemetry and no version
# check from Gradio, set before it loads (and analytics_enabled=False below as well).
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import gradio as gr

from ..api.bodies import ocr_body
from ..errors import HyocrError
from ..pipeline.media import is_pdf
from ..pipeline.service import OcrService
from ..types import MediaInput, OcrCall, SamplingParams, Task
from . import render
from .examples import write_examples
from .runner import stream_run, until_set
from .style import CSS
from .uploads import UploadCache, UploadGuard, UploadRules, remove_file

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

    from ..config import Settings

log = logging.getLogger("hyocr.ui")

PATH = "/ui"
CONCURRENCY = 16  # UI runs at once; the engine queues or batches them like API requests

# A refused upload (ui/uploads.py) answers the API's JSON error; Gradio's page shows a failed upload's
# body in its error toast as "HTTP 415: {...}": show just the message (it names the file).
_TIDY_UPLOAD_ERRORS = """<script>
(() => {
  const tidy = (root) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      const match = /^\\s*HTTP \\d{3}: (\\{[\\s\\S]*\\})\\s*$/.exec(node.data);
      if (!match || !node.parentElement || !node.parentElement.closest('[data-testid="toast-body"]')) continue;
      try {
        const error = JSON.parse(match[1]).error;
        if (error && typeof error.message === "string") node.data = error.message;
      } catch (_) { /* not an API error: leave it */ }
    }
  };
  new MutationObserver((changes) => changes.forEach((change) => {
    const target = change.type === "characterData" ? change.target.parentNode : change.target;
    if (target) tidy(target);
  })).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
})();
</script>"""
# An inline icon: browsers ask for /favicon.ico otherwise, which the API answers 404.
_HEAD = ('<link rel="icon" href="data:image/svg+xml,<svg xmlns=%22http://www.w3.org/2000/svg%22 '
         'viewBox=%220 0 100 100%22><text y=%22.9em%22 font-size=%2290%22>🔍</text></svg>">'
         + _TIDY_UPLOAD_ERRORS)
INSTRUCTIONS = """\
**1.** Upload an image (PNG, JPEG, WebP, BMP or TIFF; several files are read as pages) or a PDF, or pick an example.
**2.** Choose a task. **3.** Press **Run**: text appears as it is read, then boxes, tables and fields.
The same service answers the HTTP API: see [/docs](/docs).
"""


def ui_auth(settings: Settings) -> Callable[[Request], str | None] | None:
    """The UI's one auth hook, handed to Gradio as ``auth_dependency`` (request -> user id; None is a
    401 on every UI page, file and call).

    Who may call is decided once, for the API and the UI alike, by the app's ``AuthMiddleware``
    (``api/security.py``: the browser's login prompt with an API key as the password). When auth is
    configured, Gradio is given the identity that middleware established, so the UI fails closed,
    never open, if it were ever served without it. No auth configured: the UI is as open as the API.
    """
    from ..api.security import AuthPolicy

    if not AuthPolicy.from_settings(settings).enabled:
        return None
    return lambda request: request.scope.get("state", {}).get("principal")


def mount_ui(app: FastAPI, service: OcrService, settings: Settings) -> None:
    """Mount the UI at /ui on ``app`` (and send / there). Call once, from ``build_app``.

    Uploads pass ``UploadGuard`` (ui/uploads.py: the API's size and format rules, the upload space cap)
    before Gradio stores them. The app's working folder (examples, result files) and what Gradio cached
    for it are deleted when the app shuts down (or, for an app never started, when it is collected)."""
    from fastapi.responses import RedirectResponse
    from starlette.routing import Mount

    workdir = Path(tempfile.mkdtemp(prefix="hyocr-ui-"))
    try:
        blocks = build_ui(service, settings, workdir)
        gr.mount_gradio_app(
            app, blocks, path=PATH, auth_dependency=ui_auth(settings),
            footer_links=[], run_history=False, show_error=False, mcp_server=False, ssr_mode=False, pwa=False,
            max_file_size=max(settings.max_image_bytes, settings.max_pdf_bytes), css=CSS, head=_HEAD,
            theme=gr.themes.Soft(primary_hue="indigo"),
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    mount = next(r for r in app.router.routes if isinstance(r, Mount) and r.path == PATH)
    cache = UploadCache(blocks, settings.ui_upload_cache_bytes)
    mount.app = UploadGuard(mount.app, UploadRules.from_settings(settings), cache)
    app.state.ui_uploads, app.state.ui_workdir = cache, workdir
    _clean_up_at_shutdown(app, blocks, workdir)
    app.add_api_route("/", lambda: RedirectResponse(PATH + "/"), include_in_schema=False)
    log.info("web UI at http://%s:%d%s", settings.host, settings.port, PATH)


def _clean_up_at_shutdown(app: FastAPI, blocks: gr.Blocks, workdir: Path) -> None:
    """After the app's lifespan (Gradio's included: it deletes the files it cached for this app, but not
    the examples it keeps, nor their folders): the examples, the emptied folders and ``workdir``."""
    inner = app.router.lifespan_context
    weakref.finalize(app, shutil.rmtree, str(workdir), True)  # never started: when collected, or at exit

    def tracked() -> set[str]:
        return {path for files in list(blocks.temp_file_sets) for path in list(files)}

    @asynccontextmanager
    async def lifespan(a):
        cached: set[str] = set()
        try:
            async with inner(a) as state:
                yield state
                cached = tracked()  # before Gradio empties its sets
        finally:
            for path in cached | tracked():
                remove_file(path)
            shutil.rmtree(workdir, ignore_errors=True)

    app.router.lifespan_context = lifespan


def _touch(paths: list[str]) -> None:
    """An upload's age (Gradio's expiry and the upload space's eviction go by ctime) counts from its last use."""
    for p in paths:
        try:
            os.utime(p)
        except OSError:
            pass


def build_ui(service: OcrService, settings: Settings, workdir: Path) -> gr.Blocks:
    info = service.engine.info
    examples = write_examples(workdir / "examples")
    base_url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}"
    extensions = sorted({f".{e}" for fmt in settings.image_formats for e in _EXTENSIONS.get(fmt, (fmt,))} | {".pdf"})

    # Gradio deletes the files it cached for this app once UI_UPLOAD_TTL has passed since their last use
    # (checked every tenth of it, at most every minute), and all of them when the app stops.
    ttl = settings.ui_upload_ttl
    with gr.Blocks(title="hyocr · HunyuanOCR", analytics_enabled=False,
                   delete_cache=(max(1, min(60, ttl // 10)), ttl)) as ui:
        state = gr.State(None)  # the finished run: result, its /v1/ocr body, page previews
        gr.HTML(
            '<div class="hy-header"><h1>hyocr <span>HunyuanOCR in your browser</span></h1>'
            f'<div class="hy-badges">{render.engine_badge(info)}</div></div>'
        )
        gr.Markdown(INSTRUCTIONS, elem_classes="hy-steps")
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=340):
                files = gr.File(label="Image or PDF", file_count="multiple", file_types=extensions, height=150,
                                elem_id="hy-files")
                pages = gr.Textbox(label="PDF pages", visible=False, elem_id="hy-pdf-pages",
                                   placeholder=f"all (at most {service.max_pages}), or e.g. 1-3,8")
                task = gr.Dropdown(render.task_choices(info), value=Task.SPOTTING.value, label="Task",
                                   elem_id="hy-task")
                # LoRA adapters the engine serves are chosen by model name, as in the API.
                model = gr.Dropdown([info.model, *info.adapters], value=info.model, label="Model",
                                    visible=bool(info.adapters), elem_id="hy-model")
                note = gr.Markdown(render.task_note(Task.SPOTTING, info), elem_id="hy-task-note",
                                   elem_classes="hy-note")
                fields = gr.Textbox(label="Fields to extract", placeholder="name, ID number, date of birth",
                                    info="Comma-separated", visible=False)
                language = gr.Radio([("English", "en"), ("Chinese 中文", "zh")], value="en",
                                    label="Translate into", visible=False)
                question = gr.Textbox(label="Question", placeholder="What is the total amount?", visible=False)
                # Only a language model generates tokens; a detector's output has no length to cap.
                max_tokens = gr.Slider(16, settings.max_tokens_limit, value=settings.default_max_tokens, step=16,
                                       label="Max new tokens per page", visible=info.follows_prompts)
                with gr.Row():
                    run = gr.Button("Run", variant="primary", elem_id="hy-run", scale=3)
                    stop = gr.Button("Stop", variant="secondary", scale=1)
                download = gr.DownloadButton("Download the JSON result", visible=False, size="md",
                                             elem_id="hy-download")
                gr.Examples(_example_rows(examples, info), inputs=[files, task, fields],
                            label="Examples (drawn at start-up)", example_labels=["ID card", "Invoice"])
                with gr.Accordion("The same request with the API", open=False):
                    snippet = gr.Markdown(render.api_snippet(Task.SPOTTING, base_url))
            with gr.Column(scale=3, min_width=420):
                status = gr.HTML(render.status_html("Upload an image and press Run."), elem_id="hy-status")
                nav = gr.Radio([], label="Pages", type="index", visible=False, elem_id="hy-pages")
                image = gr.Image(label="Page", type="pil", format="png", interactive=False, height=420,
                                 buttons=["download", "fullscreen"], elem_id="hy-image")
                with gr.Tabs(selected="text") as tabs:
                    with gr.Tab("Text", id="text"):
                        text = gr.Textbox(show_label=False, lines=10, max_lines=24, buttons=["copy"],
                                          placeholder="Recognised text streams here.", elem_id="hy-text")
                    with gr.Tab("Rendered", id="rendered"):
                        rendered = gr.Markdown(
                            latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                              {"left": "$", "right": "$", "display": False}],
                            min_height=120, elem_id="hy-rendered", elem_classes="hy-rendered")
                    with gr.Tab("Fields", id="fields"):
                        fields_json = gr.JSON(show_label=False, open=True, elem_id="hy-fields")
                    with gr.Tab("JSON", id="json"):
                        body_json = gr.JSON(show_label=False, elem_id="hy-json")
                stats = gr.HTML(elem_id="hy-stats")

        view = [image, text, rendered, fields_json, body_json, stats]

        def show_page(snapshot: dict | None, index: int | None) -> dict:
            if not snapshot:
                return {}
            i = min(max(index or 0, 0), len(snapshot["previews"]) - 1)
            page = snapshot["result"].pages[i]
            return {
                image: snapshot["previews"][i],  # None: a PDF page that could not be rendered
                text: page.text or (f"[{page.error}]" if page.error else ""),
                rendered: render.rendered_markdown(snapshot["result"].task, page),
                fields_json: render.fields_view(page),
                body_json: snapshot["body"],
                stats: render.stats_html(snapshot["body"], page=i),
            }

        def on_task(value: str) -> dict:
            chosen = Task(value)
            return {
                note: render.task_note(chosen, info),
                snippet: render.api_snippet(chosen, base_url),
                fields: gr.Textbox(visible=chosen is Task.EXTRACT),
                language: gr.Radio(visible=chosen is Task.TRANSLATE),
                question: gr.Textbox(visible=chosen is Task.VQA),
            }

        async def on_upload(paths: list[str] | None) -> dict:
            if not paths:
                return {image: None, pages: gr.Textbox(visible=False),
                        status: render.status_html("Upload an image and press Run.")}
            _touch(paths)
            try:
                first, what, document = await _check_upload(paths, service)
            except HyocrError as exc:
                return {image: None, pages: gr.Textbox(visible=False),
                        status: render.status_html(_message(exc, [Path(p).name for p in paths]), "error")}
            except FileNotFoundError:
                return {image: None, pages: gr.Textbox(visible=False),
                        status: render.status_html(_GONE, "error")}
            return {image: render.preview(first)[0], pages: gr.Textbox(visible=document),
                    status: render.status_html(f"{what} ready: choose a task and press Run.")}

        stops: dict[str, asyncio.Event] = {}  # session -> its running run's Stop signal

        def on_stop(request: gr.Request) -> None:
            if request.session_hash in stops:
                stops[request.session_hash].set()

        async def on_run(paths, task_value, fields_text, target, question_text, limit, model_name, pages_text,
                         request: gr.Request):
            if not paths:
                yield {status: render.status_html("Upload an image first, or pick an example below.", "error")}
                return
            chosen = Task(task_value)
            media = []
            _touch(paths)
            try:
                for p in paths:
                    media.append(MediaInput(await asyncio.to_thread(Path(p).read_bytes), param=Path(p).name))
            except FileNotFoundError:
                yield {status: render.status_html(_GONE, "error")}
                return
            document = len(media) == 1 and is_pdf(media[0].data)
            call = OcrCall(
                media=tuple(media), task=chosen,
                fields=tuple(f.strip() for f in (fields_text or "").replace("\n", ",").split(",") if f.strip())
                if chosen is Task.EXTRACT else (),
                target_language=target or "en",
                question=question_text if chosen is Task.VQA else None,
                sampling=SamplingParams(
                    max_tokens=max(1, min(int(limit), settings.max_tokens_limit)) if info.follows_prompts else None),
                model=model_name,
                accept_pdf=True,
                pages=(pages_text or "").strip() or None if document else None,
            )
            yield {status: render.status_html("Reading…", "busy"), text: "", rendered: "", fields_json: None,
                   body_json: None, stats: "", download: gr.DownloadButton(visible=False), state: None,
                   nav: gr.Radio(visible=False), tabs: gr.Tabs(selected="text")}
            shown, last = -1, None
            stop_signal = stops[request.session_hash] = asyncio.Event()
            try:
                async for snap in until_set(stream_run(service, call), stop_signal):
                    last = snap
                    if snap.result is not None:  # the last snapshot: shown below
                        continue
                    update = {text: render.stream_display(chosen, snap.text),
                              status: render.status_html(_reading(snap), "busy")}
                    if snap.current != shown and snap.pages[snap.current].image is not None:
                        shown = snap.current
                        update[image] = render.preview(snap.pages[shown].image)[0]
                    yield update
            except HyocrError as exc:
                if not exc.public:
                    log.error("ui request failed: %s: %s", type(exc).__name__, exc.message)
                yield {status: render.status_html(_message(exc, [m.param for m in media]), "error")}
                return
            except Exception:
                log.exception("ui request failed with an unexpected error")
                yield {status: render.status_html("Internal error: the server log has the details.", "error")}
                return
            finally:
                stops.pop(request.session_hash, None)
            if last is None or last.result is None:  # stopped
                yield {status: render.status_html("Stopped.")}
                return
            result = last.result
            body = ocr_body(result)
            previews = await asyncio.to_thread(
                lambda: [render.draw_boxes(p.image, r.blocks, size=(p.width, p.height)) if p.image is not None else None
                         for p, r in zip(last.pages, result.pages, strict=True)])
            snapshot = {"result": result, "body": body, "previews": previews}
            saved = workdir / "results" / f"{result.id}.json"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(body, ensure_ascii=False, indent=2), encoding="utf-8")
            many = len(previews) > 1
            yield {
                **show_page(snapshot, 0),
                status: render.status_html(*_summary(body)),
                nav: gr.Radio(_page_labels(result), value=_page_labels(result)[0], visible=many),
                download: gr.DownloadButton(value=str(saved), visible=True),
                tabs: gr.Tabs(selected=render.RESULT_TAB.get(chosen, "text")),
                state: snapshot,
            }
            saved.unlink(missing_ok=True)  # Gradio has copied it into its own cache by now

        # Gradio runs one event of a kind at a time unless told otherwise: quick ones are unlimited,
        # the ones that decode images or run the engine are bounded.
        task.change(on_task, task, [note, snippet, fields, language, question], api_visibility="private",
                    concurrency_limit=None)
        files.change(on_upload, files, [image, pages, status], api_visibility="private",
                     concurrency_limit=CONCURRENCY)
        run.click(on_run, [files, task, fields, language, question, max_tokens, model, pages],
                  [status, nav, download, tabs, state, *view], api_visibility="private",
                  show_progress="minimal", concurrency_limit=CONCURRENCY)
        stop.click(on_stop, None, None, api_visibility="private", queue=False)
        nav.change(show_page, [state, nav], view, api_visibility="private", show_progress="hidden",
                   concurrency_limit=None)
    # What the build cached (the examples) stays while the app runs: Gradio's expiry and the upload
    # space's eviction skip what a rendered component keeps (the examples' own keep-list is on copies).
    files.keep_in_cache.update(path for cached in ui.temp_file_sets for path in cached)
    return ui


_GONE = ("The uploaded file is no longer on the server (uploads are kept for a while after their last use): "
         "upload it again.")


_EXTENSIONS = {"PNG": ("png",), "JPEG": ("jpg", "jpeg"), "WEBP": ("webp",), "BMP": ("bmp",),
               "TIFF": ("tif", "tiff"), "GIF": ("gif",), "JPEG2000": ("jp2", "j2k")}


def _example_rows(examples: dict[str, Path], info) -> list[list[Any]]:
    """The card for extraction and the invoice for parsing when the engine can; else spotting."""
    card, invoice = [str(examples["id-card"])], [str(examples["invoice"])]
    if Task.EXTRACT in info.tasks:
        return [[card, Task.EXTRACT.value, "name, ID number, date of birth, expiry date"],
                [invoice, Task.DOCUMENT.value, ""]]
    return [[card, Task.SPOTTING.value, ""], [invoice, Task.SPOTTING.value, ""]]


async def _check_upload(paths: list[str], service: OcrService):
    """Validate uploads as a run would (the service's own rules): (the first page for the preview, what was
    uploaded, whether it is a PDF)."""
    media = []
    for p in paths:
        media.append(MediaInput(await asyncio.to_thread(Path(p).read_bytes), param=Path(p).name))
    seen = await service.preview(tuple(media))
    if seen.pdf:
        return seen.first.image, f"{seen.pages}-page PDF" if seen.pages > 1 else "1-page PDF", True
    first = seen.first
    return first.image, f"{seen.pages} pages" if seen.pages > 1 else f"{first.width}×{first.height} image", False


def _page_labels(result) -> list[str]:
    """Page 1, Page 2, ...; a PDF's pages by their numbers in the document (pages=3-4: Page 3, Page 4)."""
    return [f"Page {page.index + 1}" if page.source else f"Page {i + 1}" for i, page in enumerate(result.pages)]


def _message(exc: HyocrError, files: list[str]) -> str:
    """An error's public message, naming the file it is about; internal errors say only that."""
    if not exc.public:
        return "The engine failed on this request; the server log has the details."
    if exc.param in files:  # media errors carry the file's name (MediaInput.param)
        return f"{exc.param}: {exc.message}"
    return exc.message[:1].upper() + exc.message[1:]


def _reading(snap) -> str:
    if len(snap.pages) > 1:
        return f"Reading page {snap.current + 1} of {len(snap.pages)}…"
    return "Reading…"


def _summary(body: dict) -> tuple[str, str]:
    pages = body["pages"]
    failed = [p for p in pages if p.get("error")]
    total = body["timings"]["total_ms"]
    boxes = sum(len(p["blocks"]) for p in pages)
    fields = sum(len(p["fields"]) for p in pages if p.get("fields"))
    what = f"{boxes} boxes" if boxes else f"{fields} fields" if fields else f"{len(body['text'])} characters"
    where = f" on {len(pages)} pages" if len(pages) > 1 else ""
    if failed:
        first = failed[0]
        return f"Done in {total / 1000:.1f} s; page {first['index'] + 1}: {first['error']}", "warn"
    cut = sorted({p["finish_reason"] for p in pages} & {"length", "repetition"})
    if cut:  # the text is incomplete: say why
        why = " and ".join({"length": "the token limit", "repetition": "a repeating output"}[c] for c in cut)
        return f"Done: {what}{where} in {total / 1000:.1f} s, cut short by {why}.", "warn"
    return f"Done: {what}{where} in {total / 1000:.1f} s.", "ok"
