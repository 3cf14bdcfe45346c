"""The web UI: a Gradio app on the service's own ``OcrService``, mounted at /ui by ``build_app``.

There is no second path to the engine: a run is ``service.read`` with its text streamed per page
(``runner.stream_run``), and the JSON download is the /v1/ocr body (``api.bodies.ocr_body``).
Gradio is imported only by this module and the ones it builds the page from (through ui/_gradio.py),
and only when the UI is enabled.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..pipeline.service import OcrService
from ._gradio import gr
from .examples import write_examples
from .handlers import wire_quick_events
from .page import lay_out
from .reading import Reading
from .style import CSS, HEAD
from .uploads import UploadCache, UploadGuard, UploadRules, remove_file

if TYPE_CHECKING:
    from fastapi import FastAPI, Request

    from ..config import Settings

log = logging.getLogger("hyocr.ui")

PATH = "/ui"


def ui_auth(settings: Settings) -> Callable[[Request], str | None] | None:
    """The UI's one auth hook, handed to Gradio as ``auth_dependency`` (request -> user id; None is a
    401 on every UI page, file and call).

    Who may call is decided once, for the API and the UI alike, by the app's ``AuthMiddleware``
    (``api/security.py``: the browser's login prompt with an API key as the password). When auth is
    configured, Gradio is given the identity that middleware established, so the UI fails closed,
    never open, if it were ever served without it. No auth configured: the UI is as open as the API.
    """
    from ..api.security import AuthPolicy

    policy = AuthPolicy.from_settings(settings)
    if not (policy.requires_identity or policy.allowed_ips):  # none, or scrapers' keys alone (they guard /metrics)
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
        blocks = build_ui(service, settings, workdir, metrics=getattr(app.state, "metrics", None))
        gr.mount_gradio_app(
            app, blocks, path=PATH, auth_dependency=ui_auth(settings),
            footer_links=[], run_history=False, show_error=False, mcp_server=False, ssr_mode=False, pwa=False,
            max_file_size=max(settings.max_image_bytes, settings.max_pdf_bytes), css=CSS, head=HEAD,
            theme=gr.themes.Soft(primary_hue="indigo"),
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    mount = next(r for r in app.router.routes if isinstance(r, Mount) and r.path == PATH)
    # Gradio ends its heartbeat streams (one per open tab) when its stop_event is set, which its own server
    # does on stopping; mounted here, that is the drain's start.
    drain = getattr(app.state, "drain", None)
    if drain is not None and hasattr(mount.app, "stop_event"):
        drain.on_begin.append(mount.app.stop_event.set)
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


def build_ui(service: OcrService, settings: Settings, workdir: Path, metrics=None) -> gr.Blocks:
    """The page (ui/page.py) and its events: the quick ones (ui/handlers.py), Run and Stop (ui/reading.py)."""
    examples = write_examples(workdir / "examples")
    base_url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}"
    # Gradio deletes the files it cached for this app once UI_UPLOAD_TTL has passed since their last use
    # (checked every tenth of it, at most every minute), and all of them when the app stops.
    ttl = settings.ui_upload_ttl
    with gr.Blocks(title="hyocr · HunyuanOCR", analytics_enabled=False,
                   delete_cache=(max(1, min(60, ttl // 10)), ttl)) as ui:
        w = lay_out(service.engine.info, settings, service.max_pages, examples, base_url)
        wire_quick_events(w, service, base_url)
        Reading(w, service, settings, workdir, metrics).wire()
    # What the build cached (the examples) stays while the app runs: Gradio's expiry and the upload
    # space's eviction skip what a rendered component keeps (the examples' own keep-list is on copies).
    w.files.keep_in_cache.update(path for cached in ui.temp_file_sets for path in cached)
    return ui
