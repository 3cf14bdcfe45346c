"""Run and Stop: one reading of the uploads, its text streamed into the outputs page by page, then the
finished result (boxes drawn, the /v1/ocr body, a JSON download) shown on its first page.

A run is ``service.read`` through ``runner.stream_run``, as the API's; Stop ends the session's run at the
next snapshot (``runner.until_set``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..api.bodies import ocr_body
from ..errors import HyocrError
from ..pipeline import structured
from ..pipeline.media import is_document
from ..pipeline.service import OcrService
from ..types import MediaInput, OcrCall, OcrResult, SamplingParams, Task
from . import display
from ._gradio import gr
from .handlers import CONCURRENCY, GONE, message, read_media, show_page, touch
from .page import Widgets
from .runner import stream_run, until_set

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger("hyocr.ui")


class Reading:
    """The Run and Stop buttons' handlers, for every session of the page."""

    def __init__(self, w: Widgets, service: OcrService, settings: Settings, workdir: Path, metrics=None) -> None:
        self.w, self.service, self.settings = w, service, settings
        self.metrics = metrics  # observability.metrics.Metrics: a read here counts as an API read does
        self.info = service.engine.info
        self.results = workdir / "results"  # the JSON downloads, until Gradio has copied them
        self.stops: dict[str, asyncio.Event] = {}  # session -> its running run's Stop signal

    def wire(self) -> None:
        w = self.w
        w.run.click(self.run, w.run_inputs, [w.status, w.nav, w.download, w.tabs, w.state, *w.view],
                    api_visibility="private", show_progress="minimal", concurrency_limit=CONCURRENCY)
        w.stop.click(self.stop, None, None, api_visibility="private", queue=False)

    def stop(self, request: gr.Request) -> None:
        if request.session_hash in self.stops:
            self.stops[request.session_hash].set()

    async def run(self, paths, task_value, fields_text, schema_text, target, question_text, limit, model_name,
                  pages_text, request: gr.Request):
        session = request.session_hash
        if session in self.stops:  # Run again (a double click) while this tab's run goes on: that run stands
            yield {}
            return
        stop_signal = self.stops[session] = asyncio.Event()
        outcome: dict = {"status": 499}  # what _run ends with: its status, and the result of a finished read
        started = time.perf_counter()
        try:
            async for update in self._run(stop_signal, outcome, paths, task_value, fields_text, schema_text,
                                          target, question_text, limit, model_name, pages_text):
                yield update
        finally:
            if self.stops.get(session) is stop_signal:
                del self.stops[session]
            if self.metrics is not None and "read" in outcome:  # a read began (not a form the UI refused)
                self.metrics.observe("/ui", outcome["status"], time.perf_counter() - started,
                                     _stats(outcome.get("result")))

    async def _run(self, stop_signal: asyncio.Event, outcome: dict, paths, task_value, fields_text, schema_text, target,
                   question_text, limit, model_name, pages_text):
        w = self.w
        if not paths:
            yield {w.status: display.status_html("Upload an image first, or pick an example below.", "error")}
            return
        chosen = Task(task_value)
        touch(paths)
        try:
            media = await read_media(paths)
        except FileNotFoundError:
            yield {w.status: display.status_html(GONE, "error")}
            return
        try:
            call = self._call(media, chosen, fields_text, schema_text, target, question_text, limit, model_name,
                              pages_text)
        except HyocrError as exc:  # a schema the API would refuse: the same message
            yield {w.status: display.status_html(exc.message, "error")}
            return
        yield self._cleared()
        shown, last = -1, None
        outcome["read"] = True
        try:
            async for snap in until_set(stream_run(self.service, call), stop_signal):
                last = snap
                if snap.result is None:  # else the last snapshot: shown below
                    update, shown = self._progress(chosen, snap, shown)
                    yield update
        except HyocrError as exc:
            outcome["status"] = exc.status
            if not exc.public:
                log.error("ui request failed: %s: %s", type(exc).__name__, exc.message)
            yield {w.status: display.status_html(message(exc, [m.param for m in media]), "error")}
            return
        except Exception:
            outcome["status"] = 500
            log.exception("ui request failed with an unexpected error")
            yield {w.status: display.status_html("Internal error: the server log has the details.", "error")}
            return
        if last is None or last.result is None:  # stopped
            yield {w.status: display.status_html("Stopped.")}
            return
        outcome.update(status=200, result=last.result)
        update, saved = await self._finished(chosen, last)
        yield update
        saved.unlink(missing_ok=True)  # Gradio has copied it into its own cache by now

    def _call(self, media: tuple[MediaInput, ...], chosen: Task, fields_text, schema_text, target, question_text,
              limit, model_name, pages_text) -> OcrCall:
        """The form as the API's request: only the chosen task's options, the token cap within the limit; a
        schema (extraction) checked as /v1/ocr checks it, its properties the fields."""
        document = len(media) == 1 and is_document(media[0].data)
        fields = tuple(f.strip() for f in (fields_text or "").replace("\n", ",").split(",") if f.strip())
        max_tokens = max(1, min(int(limit), self.settings.max_tokens_limit)) if self.info.follows_prompts else None
        constraint = None
        if chosen is Task.EXTRACT and (schema_text or "").strip():
            constraint, fields = structured.extraction(schema_text.strip())
        return OcrCall(
            media=media, task=chosen,
            fields=fields if chosen is Task.EXTRACT else (),
            target_language=target or "en",
            question=question_text if chosen is Task.VQA else None,
            sampling=SamplingParams(max_tokens=max_tokens, structured=constraint),
            model=model_name,
            accept_pdf=True,
            pages=(pages_text or "").strip() or None if document else None,
        )

    def _cleared(self) -> dict:
        """The outputs as a run starts: the previous run's result gone, the text tab open."""
        w = self.w
        return {w.status: display.status_html("Reading…", "busy"), w.text: "", w.rendered: "",
                w.fields_json: None, w.body_json: None, w.stats: "", w.download: gr.DownloadButton(visible=False),
                w.state: None, w.nav: gr.Radio(visible=False), w.tabs: gr.Tabs(selected="text")}

    def _progress(self, chosen: Task, snap, shown: int) -> tuple[dict, int]:
        """The text so far, and the page being read once it has an image (``shown``: the one on screen)."""
        w = self.w
        reading = f"Reading page {snap.current + 1} of {len(snap.pages)}…" if len(snap.pages) > 1 else "Reading…"
        update = {w.text: display.stream_display(chosen, snap.text), w.status: display.status_html(reading, "busy")}
        if snap.current != shown and snap.pages[snap.current].image is not None:
            shown = snap.current
            update[w.image] = display.preview(snap.pages[shown].image)[0]
        return update, shown

    async def _finished(self, chosen: Task, last) -> tuple[dict, Path]:
        """The result on its first page, the page selector and the download; and the file to delete
        once Gradio has taken it."""
        w, result = self.w, last.result
        body = ocr_body(result)
        previews = await asyncio.to_thread(
            lambda: [display.draw_boxes(p.image, r.blocks, size=(p.width, p.height)) if p.image is not None
                     else None for p, r in zip(last.pages, result.pages, strict=True)])
        snapshot = {"result": result, "body": body, "previews": previews}
        saved = self.results / f"{result.id}.json"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(body, ensure_ascii=False, indent=2), encoding="utf-8")
        labels = _page_labels(result)
        return {
            **show_page(w, snapshot, 0),
            w.status: display.status_html(*_summary(body)),
            w.nav: gr.Radio(labels, value=labels[0], visible=len(previews) > 1),
            w.download: gr.DownloadButton(value=str(saved), visible=True),
            w.tabs: gr.Tabs(selected=display.RESULT_TAB.get(chosen, "text")),
            w.state: snapshot,
        }, saved


def _page_labels(result) -> list[str]:
    """Page 1, Page 2, ...; a PDF's pages by their numbers in the document (pages=3-4: Page 3, Page 4)."""
    return [f"Page {page.index + 1}" if page.source else f"Page {i + 1}" for i, page in enumerate(result.pages)]


def _summary(body: dict) -> tuple[str, str]:
    """The status line of a finished run, and its tone: what was found, and why a page failed or was cut."""
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


def _stats(result: OcrResult | None) -> dict:
    """A finished read's figures as an API request records them (observability.logs.record): its pages, stage
    times and tokens, so that /metrics counts UI reads with the API's."""
    if result is None:
        return {}
    stats: dict = {"images": len(result.pages), "prompt_tokens": result.usage.prompt_tokens,
                   "output_tokens": result.usage.completion_tokens}
    for stage in ("fetch", "decode", "engine", "postprocess"):
        if f"{stage}_ms" in result.timings:
            stats[f"{stage}_ms"] = result.timings[f"{stage}_ms"]
    return stats
