"""Reading in this process, as ``hyocr ocr`` and ``hyocr batch`` do: the configured engine behind an
``OcrService``, and the ``OcrCall`` for one file and its options."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..config import Settings
from ..pipeline.media import is_document
from ..pipeline.service import OcrService
from ..types import MediaInput, OcrCall


@contextlib.asynccontextmanager
async def local_service(settings: Settings) -> AsyncIterator[OcrService]:
    """The engine ``settings`` name, started, behind a service; stopped on the way out."""
    from ..engines.registry import create_engine

    engine = create_engine(settings)
    service = OcrService.from_settings(engine, settings)
    await engine.start()
    try:
        yield service
    finally:
        service.close()
        await engine.stop()


def split_fields(fields: Any) -> tuple[str, ...]:
    """``--fields a,b`` or a manifest's ``["a", "b"]``."""
    items = fields.split(",") if isinstance(fields, str) else list(fields or ())
    return tuple(f.strip() for f in items if f.strip())


def file_call(data: bytes, param: str, options: Mapping[str, Any]) -> OcrCall:
    """The call for one file: ``options`` as ``hyocr ocr`` takes them (task, fields, language, question;
    pages and prefer_text_layer, which only a PDF gets). Raises HyocrError for a task it does not know."""
    from ..hunyuan.prompts import parse_task

    pdf = {"pages": options.get("pages"), "prefer_text_layer": bool(options.get("prefer_text_layer"))}
    return OcrCall(media=(MediaInput(data, param=param),), task=parse_task(options.get("task") or "spotting"),
                   fields=split_fields(options.get("fields")),
                   target_language=options.get("language") or "en", question=options.get("question"),
                   accept_pdf=True, **(pdf if is_document(data) else {}))


def check_engine_task(task: Any, settings: Settings) -> None:
    """Before the engine loads: a task the configured kind of engine cannot run (rapidocr reads text), said
    as ``OcrService.resolve_task`` says it. A HunyuanOCR 1.0 checkpoint asked for a 1.5 task is found once
    the engine has loaded, by the service."""
    from ..engines.registry import ENGINES, engines_for
    from ..errors import UnsupportedTask

    spec = ENGINES.get(settings.engine)
    if spec is None or task in spec.tasks:  # an unknown engine: create_engine says so
        return
    able = ", ".join(engines_for(task)) or "none installed"
    raise UnsupportedTask(f"task {task.value!r} needs a vision-language engine ({able}); the {spec.name} engine "
                          "runs: " + ", ".join(sorted(t.value for t in spec.tasks)), param="task")
