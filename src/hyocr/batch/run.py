"""Running a plan: documents read ``workers`` at a time, each output written whole (to DIR or an object
prefix: outputs.py) before its ``done`` line, a tqdm bar of pages on stderr (documents beside it), and
``summary.json`` at the end, also when the run stops early (Ctrl-C, a server that cannot be reached), its
unread documents ``pending``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .outputs import LocalOutput, Output, OutputError, forget, keep, kept
from .partial import Partial, discard, parts_path
from .plan import Document, options_fingerprint
from .readers import Reader, ReadFailed, ServerUnreachable, Ticket
from .sources import Sources
from .state import Decision, Record, StateFile, decide


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
    kept: Any = None  # its body, read by an earlier run whose output the store refused: written, not read
    run_id: str = ""  # the state folder's (StateFile.run_id): another folder's jobs are never its own

    @property
    def tag(self) -> dict[str, str]:
        """What a kept body was read from: a document changed since is read again."""
        return {"sha256": self.sha256, "options": self.fingerprint}

    def record(self, state: StateFile, status: str, **extra: Any) -> None:
        state.append(Record(self.doc.key, self.sha256, self.fingerprint, status,  # type: ignore[arg-type]
                            self.decision.attempt, self.decision.output, **{"job_id": self.item.job_id, **extra}))

    @property
    def idempotency_key(self) -> str:
        return self.decision.idempotency_key(self.doc.key, self.sha256, self.fingerprint, self.run_id)


@dataclass(slots=True)
class Batch:
    """The documents of one run, their outcomes, the progress bar and the summary. ``run`` reads them with
    ``reader`` (in this process, or as jobs); the Ray pipeline (hyocr/ray/data.py) drives ``begin``,
    ``done`` and ``failed`` itself, so both write the same outputs, state lines and summary."""

    docs: list[Document]
    output: Output | Path  # a Path: a local folder (LocalOutput), the state in it
    reader: Reader | None
    defaults: Mapping[str, Any]  # the command line's options; a manifest line's override them
    workers: int = 2
    max_attempts: int = 3
    sources: Sources = field(default_factory=Sources)  # how documents named by URIs are read
    summary_at: str | None = None  # where the summary was written
    summary_error: str | None = None  # why it could not be (the store refused it): kept in the state folder
    items: dict[str, Item] = field(default_factory=dict)
    pages_read: int = 0  # this run: pages that finished
    settled: int = 0  # documents done, failed or skipped this run
    stopped: dict[str, str] | None = None  # why the run ended early: {"reason", "message"}
    started: float = field(default_factory=time.monotonic)
    bar: Any = None
    label: str = "hyocr batch"  # the progress bar's name (hyocr eval reads through a Batch too)

    def __post_init__(self) -> None:
        if isinstance(self.output, Path):
            self.output = LocalOutput(self.output)
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
        """The summary (``extra``: keys of a pipeline's own, such as the Ray workers), written beside the
        outputs (``summary_at``), or kept in the state folder when the store refuses it
        (``summary_error``)."""
        summary = {**self.summary(), **extra}
        try:
            self.summary_at = self.output.write_summary(summary)
        except OutputError as exc:
            self.summary_error = str(exc)
        return summary

    def stop(self, reason: str, message: str) -> None:
        """End the run early: documents not started are not, and stay pending (no attempt spent)."""
        self.stopped = self.stopped or {"reason": reason, "message": message}

    async def one(self, doc: Document, state: StateFile) -> None:
        assert self.reader is not None
        try:
            data = await asyncio.to_thread(doc.read, self.sources)
        except OSError as exc:
            return self.unreadable(doc, exc)
        attempt = self.begin(doc, state, hashlib.sha256(data).hexdigest())
        if attempt is None:
            return
        if attempt.kept is not None:
            return await self.written(attempt, state, attempt.kept)
        item = attempt.item

        def submitted(job_id: str) -> None:
            item.job_id = job_id
            if job_id != attempt.decision.job_id:  # a new job (a re-attached one is recorded already)
                attempt.record(state, "submitted")  # before waiting: an interrupted run's rerun re-attaches

        partial = Partial(self.output.state_dir, attempt.decision.output, attempt.sha256, attempt.fingerprint)
        clamp = "pages" not in doc.overrides  # the command line's --pages: one selection for every length
        ticket = Ticket(doc.source, attempt.idempotency_key, attempt.decision.job_id, self.page_read, submitted,
                        self.pages_known, partial, clamp)
        try:
            body = await self.reader.read(data, attempt.options, ticket)
        except ReadFailed as exc:
            return self.failed(attempt, state, str(exc))
        except ServerUnreachable as exc:
            return self.stop(exc.reason, str(exc))
        await self.written(attempt, state, body)

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
        record = state.records.get(doc.key)
        decision = decide(record, name=doc.name, sha256=sha256, options=fingerprint,
                          present=self.output.present, max_attempts=self.max_attempts)
        item.output, item.attempts, item.job_id = decision.output, decision.attempt, decision.job_id
        body = None if decision.action == "skip" else kept(self.output.state_dir, decision.output,
                                                           {"sha256": sha256, "options": fingerprint})
        if body is not None:  # attempts count reads: this one only writes, whatever attempts are left
            attempts = record.attempts if record else decision.attempt
            decision = replace(decision, action="read", attempt=attempts)
            item.attempts, item.resumed = decision.attempt, True
            return Attempt(doc, item, options, sha256, fingerprint, decision, kept=body, run_id=state.run_id)
        if decision.action != "read":
            self._settled(item, decision)
            self._advance()
            return None
        return Attempt(doc, item, options, sha256, fingerprint, decision, run_id=state.run_id)

    def failed(self, attempt: Attempt, state: StateFile, error: str) -> None:
        attempt.item.status, attempt.item.error = "failed", error
        attempt.record(state, "failed", error=error)
        self._advance()

    def done(self, attempt: Attempt, state: StateFile, body: dict[str, Any]) -> None:
        """Its output written whole, then recorded: a run interrupted between the two rewrites it."""
        self._recorded(attempt, state, body, self._write(attempt, body))

    async def written(self, attempt: Attempt, state: StateFile, body: dict[str, Any]) -> None:
        """``done``, the output written on a worker thread: a store's PUT does not hold up the reads."""
        self._recorded(attempt, state, body, await asyncio.to_thread(self._write, attempt, body))

    def _write(self, attempt: Attempt, body: dict[str, Any]) -> str | None:
        """None, or why the store refused the output (its body then kept for the next run)."""
        try:
            self.output.write(attempt.decision.output, body)
        except OutputError as exc:
            where = keep(self.output.state_dir, attempt.decision.output, attempt.tag, body)
            return f"{exc}; its result is kept in {where} and the next run writes it without reading it again"
        return None

    def _recorded(self, attempt: Attempt, state: StateFile, body: dict[str, Any],
                  refused: str | None) -> None:
        name = attempt.decision.output
        if refused is not None:
            self.failed(attempt, state, refused)
        else:
            pages = body.get("pages") or []
            item = attempt.item
            item.status, item.pages, item.note = "done", len(pages), body.get("note")
            item.failed_pages = sum(1 for p in pages if p.get("finish_reason") == "error")
            attempt.record(state, "done", pages=len(pages), failed_pages=item.failed_pages)
            forget(self.output.state_dir, name)  # a body kept by an earlier run: written now
            self._advance()
        discard(parts_path(self.output.state_dir, name))  # its pages are in the output, or in the kept body

    def _settled(self, item: Item, decision: Decision) -> None:
        record = decision.record
        if decision.action == "skip" and record is not None:
            item.status, item.pages, item.resumed = "done", record.pages or 0, True
            item.failed_pages = record.failed_pages or 0
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
            "output": self.output.where,
            "state": str(self.output.state_dir),
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
