"""``hyocr batch --ray``: the batch as a Ray Data pipeline, for corpora larger than one machine reads. This
module is its entry point (``run_batch``) and the driver's side: connecting to the cluster (and shutting
down one started here), assembling the pipeline, and the documents arriving and being written
(``document_body``). The render tasks are in ``pages``, the engine actors in ``reader``.

    documents still to read (the state file decides, as in-process: hyocr/batch/)
      -> a dataset of them (sources, content hashes, options; never the bytes)
      -> render tasks (pages.py): each file read (a local path, or a URI through batch/sources.py); a PDF
         rendered by the PdfRenderer with the RenderPlan the in-process service makes for this engine, so
         the pixels are the same; one row a page (an image file is one page, decoded by the engine actor)
      -> engine actors (reader.py; ``map_batches`` with a callable class, an actor pool of ``ray_replicas``,
         each with ``ray_gpus`` GPUs and ``ray_cpus_per_replica`` CPUs): one engine and one OcrService each,
         built from the batch's settings; the rows of a batch read concurrently on the actor's event loop,
         so a continuously batching engine (vLLM) is fed
      -> the driver: each document's pages in page order into the /v1/ocr body the in-process batch writes,
         written whole and recorded (an interrupted run resumes document by document), pages/s per worker

Each page is read by ``OcrService.read`` exactly as in-process: a PDF page comes to the service as a
one-page PDF whose rendering is already done (``RenderedPages``), so it goes through the same reduction,
prompt, admission, deadline, watchdog and page rules. What differs from in-process: the request deadline
applies to each page, not to the whole document; ids, ``created`` and ``timings`` are the run's own.

Why not ``ray.data.llm`` (its vLLM processor): it runs its own preprocessing stages (OpenAI-style messages,
the checkpoint's chat template, tokenising) and then vLLM's engine from raw engine arguments, returning the
generated text. hyocr's engines build the HunyuanOCR prompt and resize each page to the model's pixel bounds
themselves, stream through the loop guard and the stall watchdog, serve LoRA adapters and structured
outputs, and parse the text into lines, boxes, markdown or fields; a second prompt path would read the same
page into different text. So this pipeline keeps its shape (an actor pool with the engine's GPUs, fed many
requests at once) and runs hyocr's own engine inside it: vLLM's AsyncLLM for ``--engine vllm``.

Ray is optional (``pip install "hyocr[ray]"``) and only imported inside functions (here, in ``pages`` and
in ``reader``).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import math
import os
import pickle
import sys
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from . import LOCAL, cluster_address
from .pages import public_message, render_document
from .reader import PageReader

if TYPE_CHECKING:
    from ..batch.run import Attempt, Batch
    from ..batch.state import StateFile
    from ..config import Settings
    from ..types import Task
    from .reader import PageOutcome

PAGES_PER_CALL = 16  # at most, rows an engine actor gets at once (map_batches' batch_size)
# Waiting for every engine actor to start (a model loaded, downloaded first, a GPU node added by the
# autoscaler) before any page is handed out: all of them get a share, and a cluster that cannot place
# them fails with Ray's message instead of waiting forever.
ACTORS_START_S = 1800
HASHING_THREADS = 8  # the driver reads files (or objects) to hash them: I/O, several at a time
ENGINE_SECRETS = ("upstream_key",)  # the only secret an engine actor needs (--engine openai)


class RayMissing(RuntimeError):
    """``--ray`` without Ray installed."""


def require_ray() -> None:
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.data") is None:
        raise RayMissing('--ray needs Ray Data: pip install "hyocr[ray]"')


@dataclass(slots=True)
class Pending:
    """A document whose pages are on their way back."""

    attempt: Attempt
    pages: dict[int, PageOutcome] = field(default_factory=dict)
    render_ms: float = 0.0


@dataclass(slots=True)
class WorkerStats:
    worker: str  # the actor's id
    node: str  # its node's IP address
    pages: int = 0
    busy_s: float = 0.0  # time with at least one page being read
    start_s: float = 0.0  # starting the engine (loading the model)

    def report(self) -> dict[str, Any]:
        rate = self.pages / self.busy_s if self.busy_s > 0 else 0.0
        return {"worker": self.worker, "node": self.node, "pages": self.pages, "busy_s": round(self.busy_s, 3),
                "pages_per_s": round(rate, 3), "engine_start_s": round(self.start_s, 3)}


def run_batch(batch: Batch, state: StateFile, settings: Settings) -> dict[str, Any]:
    """Read ``batch`` on Ray; the summary (with ``workers``: each engine actor's pages and pages/s)."""
    from ..engines.registry import create_engine
    from ..pipeline.service import OcrService

    # The engine as the in-process path would build it (not started): its tasks and how its PDFs are
    # rendered. Bad settings fail here, before a cluster is started.
    service = OcrService.from_settings(create_engine(settings), settings)
    workers: dict[str, WorkerStats] = {}
    try:
        with batch.progress():
            rows, pending = _documents_to_read(batch, state, service)
            with _cluster(settings) if rows else contextlib.nullcontext():
                if rows:
                    _read_on_ray(batch, state, settings, service, rows, pending, workers)
                report = [w.report() for w in sorted(workers.values(), key=lambda w: (w.node, w.worker))]
                summary = batch.finish(workers=report)  # before the cluster goes: whatever its end, it is written
    finally:
        service.close()
    for w in report:
        print(f"hyocr: worker {w['worker'][:12]} on {w['node']}: {w['pages']} pages in {w['busy_s']:.1f} s, "
              f"{w['pages_per_s']:.2f} pages/s (engine started in {w['engine_start_s']:.1f} s)", file=sys.stderr)
    return summary


def _documents_to_read(batch: Batch, state: StateFile,
                       service: Any) -> tuple[list[dict[str, Any]], dict[str, Pending]]:
    """Each document hashed (the state file decides on content), then settled or made a row to read."""
    from ..types import Task

    rows: list[dict[str, Any]] = []
    pending: dict[str, Pending] = {}
    defaults = batch.defaults
    with ThreadPoolExecutor(HASHING_THREADS, thread_name_prefix="hyocr-hash") as pool:
        looks = pool.map(lambda d: _look(d, d.options(defaults), service, batch.sources), batch.docs)
        for doc, look in zip(batch.docs, looks, strict=True):
            if isinstance(look, OSError):
                batch.unreadable(doc, look)
                continue
            sha256, pdf, task, refused = look
            attempt = batch.begin(doc, state, sha256)
            if attempt is None:
                continue
            if attempt.kept is not None:  # read by an earlier run, its output refused then: written now
                batch.done(attempt, state, attempt.kept)
                continue
            if refused is not None:  # the task cannot run on this engine: as in-process, before reading
                batch.failed(attempt, state, refused)
                continue
            options = attempt.options
            rows.append({"key": doc.key, "source": doc.source, "sha256": sha256, "pdf": pdf,
                         "options": json.dumps(options, default=list),
                         "pages": options.get("pages") if pdf else None,
                         "text_layer": bool(pdf and options.get("prefer_text_layer") and task is Task.TEXT)})
            pending[doc.key] = Pending(attempt)
    return rows, pending


def _look(doc: Any, options: Mapping[str, Any], service: Any,
          sources: Any) -> tuple[str, bool, Task | None, str | None] | OSError:
    """(content hash, is a PDF, the task that will run, or why none can), or the error reading it."""
    from ..batch.local import file_call
    from ..errors import HyocrError
    from ..pipeline.media import is_pdf

    try:
        data = doc.read(sources)
    except OSError as exc:
        return exc
    task, refused = None, None
    try:
        task = service.resolve_task(file_call(data, doc.source, options))[0]
    except HyocrError as exc:
        refused = public_message(exc)
    return hashlib.sha256(data).hexdigest(), is_pdf(data), task, refused


def _read_on_ray(batch: Batch, state: StateFile, settings: Settings, service: Any, rows: list[dict[str, Any]],
                 pending: dict[str, Pending], workers: dict[str, WorkerStats]) -> None:
    try:
        for row in _pipeline(settings, service, rows, batch.sources).iter_rows():
            _arrived(batch, state, row, pending, workers)
    except Exception as exc:  # noqa: BLE001 (an actor that died, a task that failed: the rest stays pending)
        print(f"hyocr: the Ray pipeline stopped: {_reason(exc)}; {len(pending)} document(s) not read "
              "(run the batch again to read them)", file=sys.stderr)


def _reason(exc: BaseException) -> str:
    """The last line of what went wrong (Ray wraps a task's error in its traceback text)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[-1][:500]


@contextlib.contextmanager
def _cluster(settings: Settings) -> Iterator[None]:
    """Connected to Ray for the block: ``ray_address`` (else RAY_ADDRESS), or a local cluster started here
    and stopped after. A process connected already (a caller of its own) stays connected."""
    import ray

    if ray.is_initialized():
        yield
        return
    _connect(settings)
    try:
        yield
    finally:
        # The pipeline's object references are freed now, while Ray is up: a reference in a cycle, freed
        # by a garbage collection after the shutdown (in whatever thread), makes Ray end the process.
        gc.collect()
        ray.shutdown()


def _connect(settings: Settings) -> None:
    import ray

    # The summary and the lines on stderr report; the workers' logs stay in the session's folder.
    quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "WARNING")  # not its INFO lines about each dataset
    address = cluster_address(settings)
    if address != LOCAL:
        ray.init(address=address, **quiet)
    else:
        # A cluster of its own ("local": not one that `ray start` left running), with room for the engine
        # actors and at least one render task beside them, on any machine.
        needed = math.ceil(settings.ray_replicas * settings.ray_cpus_per_replica) + 1
        ray.init(address=LOCAL, num_cpus=max(os.cpu_count() or 1, needed), include_dashboard=False, **quiet)


def _pipeline(settings: Settings, service: Any, rows: list[dict[str, Any]], sources: Any) -> Any:
    import ray.data
    from ray.util.debug import log_once

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the batch's own bar counts documents and pages
    log_once("ray_data_progress_manager_disabled")  # and Ray Data need not say so
    context.wait_for_min_actors_s = ACTORS_START_S
    pdf = {"workers": 1, "timeout": settings.pdf_render_timeout, "memory_mb": settings.pdf_worker_memory_mb}
    feed = pages_in_flight(settings, service.engine.info.follows_prompts)
    batch_size = min(PAGES_PER_CALL, feed)
    calls = math.ceil(feed / batch_size)
    return (
        ray.data.from_items(rows, override_num_blocks=min(len(rows), 1000))
        .flat_map(render_document, fn_kwargs={"plan": service.inputs.pdf_plan, "limits": service.inputs.limits,
                                              "max_pages": service.max_pages, "pdf": pdf, "sources": sources})
        .map_batches(
            PageReader, batch_size=batch_size, batch_format="pyarrow",
            fn_constructor_kwargs={"settings": settings_payload(settings)},
            # One batch queued beyond those being read: the rest wait for whichever actor is free first.
            compute=ray.data.ActorPoolStrategy(size=settings.ray_replicas, max_concurrent_calls_per_actor=calls,
                                               max_tasks_in_flight_per_actor=calls + 1,
                                               enable_true_multi_threading=True),
            num_cpus=settings.ray_cpus_per_replica, num_gpus=settings.ray_gpus or None,
        )
    )


def pages_in_flight(settings: Settings, batching: bool) -> int:
    """Pages an engine actor reads at once: a model engine batches them (as many as the server admits);
    a detector reads ``workers`` at a time, and one more each keeps it busy between batches."""
    return settings.max_concurrency if batching else min(settings.max_concurrency, 2 * settings.workers)


def settings_payload(settings: Settings) -> dict[str, Any]:
    """The settings as plain values for the actors (they build their own Settings from them); of the
    secrets, only those an engine uses travel."""
    values = settings.model_dump()
    return {k: (v.get_secret_value() if k in ENGINE_SECRETS else None) if isinstance(v, SecretStr) else v
            for k, v in values.items()}


def _arrived(batch: Batch, state: StateFile, row: dict[str, Any], pending: dict[str, Pending],
             workers: dict[str, WorkerStats]) -> None:
    """One row back from the pipeline: a page of a document, or a document that failed before its pages."""
    doc = pending.get(row["key"])
    if doc is None:  # a page of a document that failed already
        return
    if row["worker"]:
        stats = workers.setdefault(row["worker"], WorkerStats(row["worker"], row["node"]))
        stats.pages, stats.busy_s = max(stats.pages, row["worker_pages"]), max(stats.busy_s, row["worker_busy_s"])
        stats.start_s = row["worker_start_s"]
    if not doc.pages and row.get("total"):  # its first row: the bar's total grows by its pages
        batch.pages_known(row["total"])
    error = row["error"]
    if error is None:
        outcome: PageOutcome = pickle.loads(row["outcome"])
        if outcome.page is not None:
            batch.page_read()
        error = outcome.error
        doc.pages[row["position"]] = outcome
        doc.render_ms += row["render_ms"]
    if error is not None:
        del pending[row["key"]]
        return batch.failed(doc.attempt, state, error)
    if len(doc.pages) == row["total"]:
        del pending[row["key"]]
        batch.done(doc.attempt, state, document_body([doc.pages[n] for n in range(row["total"])], doc.render_ms))


def document_body(outcomes: list[PageOutcome], render_ms: float) -> dict[str, Any]:
    """A document's pages (in page order) -> the /v1/ocr body, as the in-process read's result would give."""
    from ..api.bodies import ocr_body
    from ..types import OcrResult, Usage

    first = outcomes[0]
    usage = Usage()
    timings: dict[str, float] = {}
    for outcome in outcomes:
        usage = usage + outcome.page.usage  # type: ignore[union-attr]
        for key, ms in outcome.timings.items():
            timings[key] = timings.get(key, 0.0) + (ms or 0.0)
    for key in ("decode_ms", "total_ms"):  # rendering is part of decoding a PDF, as in-process
        timings[key] = timings.get(key, 0.0) + render_ms
    result = OcrResult(id=f"ocr-{uuid.uuid4().hex}", model=first.model, engine=first.engine, task=first.task,
                       requested_task=first.requested_task, pages=tuple(o.page for o in outcomes),  # type: ignore[misc]
                       usage=usage, timings={k: round(v, 2) for k, v in timings.items()})
    return ocr_body(result)
