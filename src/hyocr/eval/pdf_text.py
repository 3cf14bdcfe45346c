"""``--truth pdf-text``: PDFs whose own text layer is the reference, for born-digital documents (where the
text layer is right): any pile of real PDFs becomes an evaluation set without labelling.

The text layer is read the way ``prefer_text_layer`` reads it, by the service's own PDF render pool
(pipeline/pdf.py: PDFium in worker processes, so a hostile PDF costs a worker, not this process) with the
same trust rule (pdf_worker.text_layer_reliable: 16+ visible characters, 95% of them real characters): a
page that fails it (a scan, a broken font encoding) has no reference and is not read. PDFium writes a
hyphen that breaks a word at a line's end as U+0002; it is read as the "-" the page shows.

The engine reads the pages rendered, never their text layer (``--prefer-text-layer`` would score the
reference against itself). A document with more reliable pages than ``MAX_PAGES`` (64) is read in several
requests of at most that many pages, each its own sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..batch.plan import Document, PlanError, expand
from ..config import Settings
from . import EvalError
from .sets import LoadedSet, Sample, Truth

NO_TEXT_LAYER = "no reliable text layer (a scan, or a broken font encoding)"


def _is_pdf(doc: Document) -> bool:
    if doc.path.suffix.lower() == ".pdf":
        return True
    try:
        with doc.path.open("rb") as f:
            return f.read(5) == b"%PDF-"
    except OSError:
        return False


async def load(given: str, defaults: Mapping[str, Any], settings: Settings, *,
               exclude: Path | None = None) -> LoadedSet:
    """``given``: a PDF, a folder or a glob (as hyocr batch expands them); ``defaults["pages"]`` selects
    pages of every document."""
    from ..errors import HyocrError
    from ..pipeline.pdf import PdfRenderer, RenderPlan

    try:
        docs = [d for d in expand([given], exclude=exclude) if _is_pdf(d)]
    except PlanError as exc:
        raise EvalError(str(exc)) from None
    if not docs:
        raise EvalError(f"{given}: no PDF there")
    loaded = LoadedSet("pdf-text", given, [])
    # Pages without a trusted text layer are rendered by the worker; at the lowest DPI they cost little.
    plan = RenderPlan(pages=defaults.get("pages"), max_pages=1_000_000, min_dpi=36, fixed_dpi=36, text_layer=True)
    renderer = PdfRenderer(workers=1, timeout=settings.pdf_render_timeout, memory_mb=settings.pdf_worker_memory_mb)
    task = defaults.get("task") or "text"
    try:
        for doc in docs:
            try:
                data = doc.read()
                try:
                    rendered = await renderer.render(data, plan, param=doc.source)
                except HyocrError as exc:
                    if exc.code != "invalid_pages" or "out of range" not in exc.message:
                        raise
                    # --pages 1-20 over a folder: a shorter PDF is read to its end, not skipped whole
                    count = (await renderer.render(data, replace(plan, pages="1"), param=doc.source)).page_count
                    within = clamp_pages(plan.pages or "", count)
                    if not within:
                        raise
                    rendered = await renderer.render(data, replace(plan, pages=within), param=doc.source)
            except (HyocrError, OSError) as exc:
                why = getattr(exc, "message", None) or getattr(exc, "strerror", None) or str(exc)
                loaded.skipped_documents.append({"path": doc.source, "why": why})
                continue
            truths = [Truth(p.index, (p.text or "").replace("\x02", "-")) for p in rendered.pages
                      if p.source == "text_layer"]
            skipped = tuple((p.index, NO_TEXT_LAYER if p.error is None else p.error) for p in rendered.pages
                            if p.source != "text_layer")
            if not truths:
                loaded.skipped_documents.append({"path": doc.source, "why": NO_TEXT_LAYER})
                continue
            for part, chunk in enumerate(_chunks(truths, settings.max_pages)):
                pages = ",".join(str(t.page + 1) for t in chunk)  # type: ignore[operator]
                rel = doc.rel if part == 0 else f"{doc.rel}#{part + 1}"
                loaded.samples.append(Sample(Document(doc.path, rel, {"task": task, "pages": pages}), tuple(chunk),
                                             skipped=skipped if part == 0 else ()))
    finally:
        renderer.close()
    if not loaded.samples:  # each document's own reason (damaged, encrypted, --pages past its end, a scan)
        reasons = "; ".join(f"{Path(s['path']).name}: {s['why']}" for s in loaded.skipped_documents[:5])
        raise EvalError(f"{given}: no PDF page with a reliable text layer" + (f" ({reasons})" if reasons else ""))
    return loaded


def clamp_pages(spec: str, count: int) -> str:
    """``spec`` ("2-5,8", "7-") cut to a document of ``count`` pages ("" when none of it is there)."""
    kept = []
    for part in spec.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.strip().isdigit() or int(first) > count:
            continue
        end = min(int(last), count) if last.strip().isdigit() else count if dash else int(first)
        kept.append(f"{int(first)}-{end}" if end != int(first) else first.strip())
    return ",".join(kept)


def _chunks(truths: list[Truth], size: int) -> list[list[Truth]]:
    return [truths[i:i + size] for i in range(0, len(truths), size)]
