"""Running a plan: documents read ``workers`` at a time, each output written whole before its ``done`` line,
a tqdm bar of pages on stderr (documents beside it), and ``summary.json`` at the end, also when the run
stops early (Ctrl-C, a server that cannot be reached), its unread documents ``pending``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .partial import Partial, discard, parts_path
from .plan import Document, options_fingerprint
from .readers import Reader, ReadFailed, ServerUnreachable, Ticket
from .state import Decision, Record, StateFile, decide, write_atomic

SUMMARY = "summary.json"


@dataclass(slots=True)
class Item:
    """One document's line in the summary."""

    path: str
    output: str
    status: str = "pending"  # done | failed | pending (interrupted)
    attempts: int = 0
    pages: int = 0
    failed_pages: int = 0
    resumed: bool = False  # done by an earlier run, not read again
    error: str | None = None
    job_id: str | None = None
    note: str | None = None  # e.g. --pages cut to a shorter document


@dataclass(slots=True)
class Attempt:
    """A document this run reads: what its state lines record (content, options, attempt, output name)."""

    doc: Document
    item: Item
    options: dict[str, Any]
    sha256: str
    fingerprint: str
    decision: Decision

    def record(self, state: StateFile, status: str, **extra: Any) -> None:
        state.append(Record(self.doc.key, self.sha256, self.fingerprint, status,  # type: ignore[arg-type]
                            self.decision.attempt, self.decision.output, **{"job_id": self.item.job_id, **extra}))

    @property
    def idempotency_key(self) -> str:
        return self.decision.idempotency_key(self.doc.key, self.sha256, self.fingerprint)


@dataclass(slots=True)
class Batch:
    """The documents of one run, their outcomes, the progress bar and the summary. ``run`` reads them with
    ``reader`` (in this process, or as jobs); the Ray pipeline (hyocr/ray/data.py) drives ``begin``,
    ``done`` and ``failed`` itself, so both write the same outputs, state lines and summary."""

    docs: list[Document]
    out_dir: Path
    reader: Reader | None
    defaults: Mapping[str, Any]  # the command line's options; a manifest line's override them
    workers: int = 2
    max_attempts: int = 3
    items: dict[str, Item] = field(default_factory=dict)
    pages_read: int = 0  # this run: pages that finished
    settled: int = 0  # documents done, failed or skipped this run
    stopped: dict[str, str] | None = None  # why the run ended early: {"reason", "message"}
    started: float = field(default_factory=time.monotonic)
    bar: Any = None
    label: str = "hyocr batch"  # the progress bar's name (hyocr eval reads through a Batch too)

    def __post_init__(self) -> None:
        # Before any reading: a run stopped while the engine loads still says what it left pending.
        self.items = self.items or {d.key: Item(d.source, d.name) for d in self.docs}

    async def run(self, state: StateFile) -> dict[str, Any]:
        gate = asyncio.Semaphore(self.workers)

        async def guarded(doc: Document) -> None:
            async with gate:
                if self.stopped is None:
                    await self.one(doc, state)

        with self.progress():
            await asyncio.gather(*(guarded(d) for d in self.docs))
        return self.finish()

    @contextlib.contextmanager
    def progress(self) -> Iterator[None]:
        """A bar of pages on stderr while the run lasts: its total grows as documents are opened (a PDF's
        pages are known once it is), documents settled beside it."""
        from tqdm import tqdm

        self.bar = tqdm(total=None, unit="page", desc=self.label, file=sys.stderr, disable=None,
                        dynamic_ncols=True, postfix=self._documents())
        try:
            yield
        finally:
            self.bar.close()

    def finish(self, **extra: Any) -> dict[str, Any]:
        """The summary (``extra``: keys of a pipeline's own, such as the Ray workers), written to DIR."""
        summary = {**self.summary(), **extra}
        write_atomic(self.out_dir / SUMMARY, summary)
        return summary

    def stop(self, reason: str, message: str) -> None:
        """End the run early: documents not started are not, and stay pending (no attempt spent)."""
        self.stopped = self.stopped or {"reason": reason, "message": message}

    async def one(self, doc: Document, state: StateFile) -> None:
        assert self.reader is not None
        try:
            data = await asyncio.to_thread(doc.read)
        except OSError as exc:
            return self.unreadable(doc, exc)
        attempt = self.begin(doc, state, hashlib.sha256(data).hexdigest())
        if attempt is None:
            return
        item = attempt.item

        def submitted(job_id: str) -> None:
            item.job_id = job_id
            if job_id != attempt.decision.job_id:  # a new job (a re-attached one is recorded already)
                attempt.record(state, "submitted")  # before waiting: an interrupted run's rerun re-attaches

        partial = Partial(self.out_dir, attempt.decision.output, attempt.sha256, attempt.fingerprint)
        clamp = "pages" not in doc.overrides  # the command line's --pages: one selection for every length
        ticket = Ticket(doc.source, attempt.idempotency_key, attempt.decision.job_id, self.page_read, submitted,
                        self.pages_known, partial, clamp)
        try:
            body = await self.reader.read(data, attempt.options, ticket)
        except ReadFailed as exc:
            return self.failed(attempt, state, str(exc))
        except ServerUnreachable as exc:
            return self.stop("server_unreachable", str(exc))
        self.done(attempt, state, body)

    def unreadable(self, doc: Document, exc: OSError) -> None:
        """Its bytes could not be read: nothing was, so it is no attempt."""
        item = self.items[doc.key]
        item.status, item.error = "failed", exc.strerror or str(exc)
        self._advance()

    def begin(self, doc: Document, state: StateFile, sha256: str) -> Attempt | None:
        """What this run does with ``doc`` (its content's hash given): an attempt to read it, or None when it
        is done already or out of attempts (settled here)."""
        item = self.items[doc.key]
        options = doc.options(self.defaults)
        fingerprint = options_fingerprint(options)
        decision = decide(state.records.get(doc.key), name=doc.name, sha256=sha256, options=fingerprint,
                          out_dir=self.out_dir, max_attempts=self.max_attempts)
        item.output, item.attempts, item.job_id = decision.output, decision.attempt, decision.job_id
        if decision.action != "read":
            self._settled(item, decision)
            self._advance()
            return None
        return Attempt(doc, item, options, sha256, fingerprint, decision)

    def failed(self, attempt: Attempt, state: StateFile, error: str) -> None:
        attempt.item.status, attempt.item.error = "failed", error
        attempt.record(state, "failed", error=error)
        self._advance()

    def done(self, attempt: Attempt, state: StateFile, body: dict[str, Any]) -> None:
        """Its output written whole, then recorded: a run interrupted between the two rewrites it."""
        write_atomic(self.out_dir / attempt.decision.output, body)
        pages = body.get("pages") or []
        item = attempt.item
        item.status, item.pages, item.note = "done", len(pages), body.get("note")
        item.failed_pages = sum(1 for p in pages if p.get("finish_reason") == "error")
        attempt.record(state, "done", pages=len(pages))
        discard(parts_path(self.out_dir, attempt.decision.output))  # its pages are in the output now
        self._advance()

    def _settled(self, item: Item, decision: Decision) -> None:
        record = decision.record
        if decision.action == "skip" and record is not None:
            item.status, item.pages, item.resumed = "done", record.pages or 0, True
        elif record is not None:
            item.status, item.error = "failed", record.error

    def pages_known(self, pages: int) -> None:
        """A document's pages to read this run are known (a PDF opened): the bar's total grows."""
        if pages:
            self.bar.total = (self.bar.total or 0) + pages
            self.bar.refresh()

    def page_read(self) -> None:
        self.pages_read += 1
        self.bar.update(1)

    def _advance(self) -> None:
        self.settled += 1
        self._postfix()
        self.bar.refresh()

    def _postfix(self) -> None:
        self.bar.set_postfix_str(self._documents(), refresh=False)

    def _documents(self) -> str:
        return f"{self.settled}/{len(self.docs)} documents"

    def summary(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        items = list(self.items.values())
        done = [i for i in items if i.status == "done"]
        return {
            "object": "hyocr.batch.summary",
            "output": str(self.out_dir),
            "documents": {"total": len(items), "done": len(done),
                          "failed": sum(1 for i in items if i.status == "failed"),
                          "resumed": sum(1 for i in done if i.resumed)},
            "pages": {"total": sum(i.pages for i in done), "failed": sum(i.failed_pages for i in done),
                      "read_this_run": self.pages_read},
            "elapsed_s": round(elapsed, 3),
            "pages_per_s": round(self.pages_read / elapsed, 3) if elapsed > 0 else 0.0,
            **({"stopped": self.stopped} if self.stopped else {}),
            "items": [{k: v for k, v in (
                ("path", i.path), ("output", i.output if i.status == "done" else None), ("status", i.status),
                ("attempts", i.attempts), ("pages", i.pages), ("failed_pages", i.failed_pages),
                ("resumed", i.resumed), ("error", i.error), ("job_id", i.job_id), ("note", i.note))}
                      for i in items],
        }
