"""Running a plan: documents read ``workers`` at a time, each output written whole before its ``done`` line,
a tqdm bar on stderr, and ``summary.json`` at the end."""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .plan import Document, options_fingerprint
from .readers import Reader, ReadFailed, Ticket
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


@dataclass(slots=True)
class Batch:
    docs: list[Document]
    out_dir: Path
    reader: Reader
    defaults: Mapping[str, Any]  # the command line's options; a manifest line's override them
    workers: int = 2
    max_attempts: int = 3
    items: dict[str, Item] = field(default_factory=dict)
    pages_read: int = 0  # this run: pages that finished
    started: float = field(default_factory=time.monotonic)
    bar: Any = None

    async def run(self, state: StateFile) -> dict[str, Any]:
        from tqdm import tqdm

        self.items = {d.key: Item(str(d.path), d.name) for d in self.docs}
        gate = asyncio.Semaphore(self.workers)
        self.bar = tqdm(total=len(self.docs), unit="doc", desc="hyocr batch", file=sys.stderr, disable=None,
                        dynamic_ncols=True)
        try:
            async def guarded(doc: Document) -> None:
                async with gate:
                    await self.one(doc, state)
            await asyncio.gather(*(guarded(d) for d in self.docs))
        finally:
            self.bar.close()
        summary = self.summary()
        write_atomic(self.out_dir / SUMMARY, summary)
        return summary

    async def one(self, doc: Document, state: StateFile) -> None:
        item = self.items[doc.key]
        options = doc.options(self.defaults)
        try:
            data = await asyncio.to_thread(doc.path.read_bytes)
        except OSError as exc:
            item.status, item.error = "failed", exc.strerror or str(exc)  # nothing read: not an attempt
            return self._advance()
        sha, fingerprint = hashlib.sha256(data).hexdigest(), options_fingerprint(options)
        decision = decide(state.records.get(doc.key), name=doc.name, sha256=sha, options=fingerprint,
                          out_dir=self.out_dir, max_attempts=self.max_attempts)
        item.output, item.attempts, item.job_id = decision.output, decision.attempt, decision.job_id
        if decision.action != "read":
            self._settled(item, decision)
            return self._advance()

        def record(status: str, **extra: Any) -> None:
            state.append(Record(doc.key, sha, fingerprint, status, decision.attempt,  # type: ignore[arg-type]
                                decision.output, **{"job_id": item.job_id, **extra}))

        def submitted(job_id: str) -> None:
            item.job_id = job_id
            if job_id != decision.job_id:  # a new job (a re-attached one is recorded already)
                record("submitted")  # before waiting: an interrupted run's rerun re-attaches to it

        ticket = Ticket(str(doc.path), decision.idempotency_key(doc.key, sha, fingerprint), decision.job_id,
                        self._page, submitted)
        try:
            body = await self.reader.read(data, options, ticket)
        except ReadFailed as exc:
            item.status, item.error = "failed", str(exc)
            record("failed", error=str(exc))
            return self._advance()
        write_atomic(self.out_dir / decision.output, body)  # whole, then recorded: a rerun rewrites it
        pages = body.get("pages") or []
        item.status, item.pages = "done", len(pages)
        item.failed_pages = sum(1 for p in pages if p.get("finish_reason") == "error")
        record("done", pages=len(pages))
        self._advance()

    def _settled(self, item: Item, decision: Decision) -> None:
        record = decision.record
        if decision.action == "skip" and record is not None:
            item.status, item.pages, item.resumed = "done", record.pages or 0, True
        elif record is not None:
            item.status, item.error = "failed", record.error

    def _page(self) -> None:
        self.pages_read += 1
        self._postfix()

    def _advance(self) -> None:
        self.bar.update(1)
        self._postfix()

    def _postfix(self) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix(pages=self.pages_read, pages_s=f"{self.pages_read / elapsed:.2f}", refresh=False)

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
            "items": [{k: v for k, v in (
                ("path", i.path), ("output", i.output if i.status == "done" else None), ("status", i.status),
                ("attempts", i.attempts), ("pages", i.pages), ("failed_pages", i.failed_pages),
                ("resumed", i.resumed), ("error", i.error), ("job_id", i.job_id))} for i in items],
        }
