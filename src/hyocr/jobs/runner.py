"""JobRunner: reads stored jobs in the background, range by range, through the same ``OcrService.read`` as
/v1/ocr (admission, deadline, watchdog and all), below online traffic; and the batches' chunks of lines
(jobs/batch_runner.py), in turn with the ranges, under the same rule.

Online requests come first: a range starts only while fewer than (1 - JOB_ONLINE_RESERVE) x MAX_CONCURRENCY
requests are in flight and none is queued, and at most JOB_WORKERS ranges run at once. Each page is stored
as it finishes; a range that stops half-way (a crash, a restart, a retryable error) is read again for the
pages it has not stored. A lease, renewed while the range runs, frees the range of a replica that died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import HyocrError
from ..pipeline.service import OcrService
from ..types import FinishReason, PageRead, PageResult
from .batch_store import ACTIVE as BATCH_ACTIVE
from .batch_store import ENDED as BATCH_ENDED
from .codec import at_position
from .loops import passes
from .outbox import Outbox
from .store import Claim, JobRecord, JobStore
from .webhooks import event_body

if TYPE_CHECKING:
    from .batch_runner import BatchRunner
    from .exports import JobExports

log = logging.getLogger("hyocr.jobs")
BACKGROUND = 1  # EngineRequest.priority of a job's pages: after every waiting online request


class JobRunner:
    def __init__(self, store: JobStore, service: OcrService, settings, *,
                 describe: Callable[[JobRecord], dict] | None = None, metrics=None, poll: float = 0.5) -> None:
        self.store = store
        self.describe = describe  # a job's wire object, for its webhook (the api layer's job_body)
        self.service = service
        self.settings = settings
        self.outbox = Outbox(store.engine, settings, policy=service.inputs.fetch_policy, metrics=metrics)
        self.metrics = metrics
        self.poll = poll
        self.replica = uuid.uuid4().hex[:16]
        self.wake = asyncio.Event()  # a job was submitted, or a range ended: look for work now
        self.batch_wake = asyncio.Event()  # a batch was created or cancelled: whole-batch work may be due
        self.export_wake = asyncio.Event()  # a job with an output URI ended
        self.batches: BatchRunner | None = None  # set by Jobs: batch chunks share the dispatcher
        self.exports: JobExports | None = None
        # running work, by key ("r<range id>", "b<chunk id>") -> its task; and the job or batch it belongs to,
        # for stopping a cancelled one's work here
        self._ranges: dict[str, asyncio.Task] = {}
        self._job_of: dict[str, str] = {}
        self._loops: list[asyncio.Task] = []
        self._batch_turn = False  # ranges and batch chunks are claimed in turn

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        self._loops = [asyncio.create_task(self._dispatch()), asyncio.create_task(self.outbox.run(self.poll)),
                       asyncio.create_task(self._sweep())]
        if self.batches is not None:
            self._loops.append(asyncio.create_task(self.batches.run(self.poll, self.batch_wake, self.wake)))
        if self.exports is not None:
            self._loops.append(asyncio.create_task(self.exports.run(self.poll, self.export_wake)))

    async def stop(self) -> None:
        """Stop reading: ranges in progress are given back at once (not left to their lease), so a restart
        or another replica picks them up; their stored pages stay."""
        for task in [*self._loops, *self._ranges.values()]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._ranges.values(), return_exceptions=True)

    # ------------------------------------------------------------------ dispatch

    def _room(self) -> bool:
        admission = self.service.admission
        online_cap = admission.max_concurrency * (1 - self.settings.job_online_reserve)
        return (len(self._ranges) < self.settings.job_workers and admission.waiting == 0
                and admission.in_flight < max(1.0, online_cap))

    async def _dispatch(self) -> None:
        await passes(self._dispatch_pass, self.wake, self.poll, "job dispatch")

    async def _dispatch_pass(self) -> bool:
        claimed = False
        while self._room() and (work := await self._claim()) is not None:
            key, owner, run = work
            task = asyncio.create_task(run)
            self._ranges[key], self._job_of[key] = task, owner
            task.add_done_callback(self._forget)
            claimed = True
        await self._refresh_metrics()
        return claimed

    async def _claim(self):
        """(key, job or batch id, the coroutine to run) of the next work: a job's range or a batch's chunk,
        in turn when both wait."""
        for batch_turn in (self._batch_turn, not self._batch_turn):
            if batch_turn and self.batches is not None:
                if (chunk := await self.batches.claim()) is not None:
                    self._batch_turn = False
                    return f"b{chunk.chunk_id}", chunk.batch_id, self._run_chunk(chunk)
            elif not batch_turn:
                claim = await self.store.claim(self.replica, max_running=self.settings.job_max_running)
                if claim is not None:
                    self._batch_turn = True
                    return f"r{claim.range_id}", claim.job_id, self._run(claim)
        return None

    async def _run_chunk(self, chunk) -> None:
        try:
            await self.batches.run_chunk(chunk)
        finally:
            self.wake.set()
            self.batch_wake.set()  # its batch may be done: finalize it

    def _forget(self, task: asyncio.Task) -> None:
        for range_id in [r for r, t in self._ranges.items() if t is task]:
            del self._ranges[range_id], self._job_of[range_id]

    def stop_job(self, job_id: str) -> None:
        """Stop this replica's ranges of a cancelled job, or chunks of a cancelled batch, now (other replicas
        stop at their next renewal)."""
        for range_id, owner in list(self._job_of.items()):
            if owner == job_id:
                self._ranges[range_id].cancel()

    async def _run(self, claim: Claim) -> None:
        renewing = asyncio.create_task(self._renew(claim, asyncio.current_task()))
        try:
            await self._read(claim)
            await self.store.finish_range(claim.range_id, self.replica)
            await self._maybe_complete(claim.job_id)
        except asyncio.CancelledError:  # cancelled job, lost lease, or stopping: the pages stored stay
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release_range(claim.range_id, self.replica, tried=False))
            raise
        except HyocrError as exc:
            await self._failed(claim, exc)
        except Exception:
            log.exception("job %s range %d failed", claim.job_id, claim.range_id)
            await self.store.release_range(claim.range_id, self.replica, not_before=time.time() + 5)
        finally:
            renewing.cancel()
            self.wake.set()

    async def _read(self, claim: Claim) -> None:
        """Read the range's pages not stored yet."""
        todo = await self._unstored(claim)
        if not todo:
            return
        if claim.attempts > self.settings.job_max_attempts:  # its replica went down while reading it, each time
            await self._one_at_a_time(claim, todo)
            return
        await self._read_pages(claim, todo)

    async def _one_at_a_time(self, claim: Claim, todo: list[tuple[int, int]]) -> None:
        """A range claimed past its budget: a retryable failure ends on the last attempt, so its replica went down
        while reading it, each time. A page that takes the server down must not do so for ever, and the pages
        beside it must not fail with it: the pages are read one at a time, each stored, so that a crash leaves the
        pages before it stored. Claimed once more, the first page not stored is the one being read when the server
        went down again: it alone is an error page; the rest are read."""
        if claim.attempts > self.settings.job_max_attempts + 1:
            message = f"this page was not read: its server went down each time it read it ({claim.attempts - 1} times)"
            await self._error_pages(claim, todo[:1], message)
            todo = todo[1:]
        for pair in todo:
            try:
                await self._read_pages(claim, [pair])
            except HyocrError as exc:  # past the budget nothing is tried again: the page's own error
                await self._error_pages(claim, [pair], _page_error(exc))

    async def _read_pages(self, claim: Claim, todo: list[tuple[int, int]]) -> None:
        """Read the pages of ``todo`` together, storing each as it finishes."""
        if claim.pdf:
            call = replace(claim.call, pages=",".join(str(item + 1) for _, item in todo))
        else:
            by_n = dict(zip(claim.items, claim.call.media, strict=False))
            call = replace(claim.call, media=tuple(by_n[item] for _, item in todo), pages=None)
        # A document of several pages keeps a page that cannot be rendered as its error page, even when a whole
        # range is such pages; one page alone is read as a request is (its refusal is the job's error).
        call = replace(call, priority=BACKGROUND, document_range=claim.pdf and claim.pages_total > 1)
        positions = [pos for pos, _ in todo]
        events = self.service.read(call, request_id=f"{claim.job_id}-r{claim.range_id}")
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, PageRead):
                    position = positions[event.position]
                    page = at_position(event.page, position, claim.pdf)
                    if await self.store.put_page(claim.job_id, position, page):
                        self._count_page()

    async def _failed(self, claim: Claim, exc: HyocrError) -> None:
        """A retryable failure (overload, a restarting engine, a deadline) is tried again later, up to
        JOB_MAX_ATTEMPTS; anything else (the document itself) makes its pages error pages. A range of images
        read together fails as a whole when one of them is bad: then each is read on its own, so a corrupt
        image fails its own page only, as on /v1/ocr."""
        if self._retry(claim, exc):
            await self._again_later(claim, exc)
            return
        todo = await self._unstored(claim)
        if not claim.pdf and len(todo) > 1:
            for pair in todo:
                try:
                    await self._read_pages(claim, [pair])
                except HyocrError as one:
                    if self._retry(claim, one):  # its pages stored so far stay: a retry reads the rest
                        await self._again_later(claim, one)
                        return
                    await self._error_pages(claim, [pair], _page_error(one))
        else:
            await self._error_pages(claim, todo, _page_error(exc))
        await self.store.finish_range(claim.range_id, self.replica)
        await self._maybe_complete(claim.job_id)

    def _retry(self, claim: Claim, exc: HyocrError) -> bool:
        return exc.status >= 500 and claim.attempts < self.settings.job_max_attempts

    async def _again_later(self, claim: Claim, exc: HyocrError) -> None:
        delay = min(60.0, 2.0 ** claim.attempts)
        log.warning("job %s range %d: %s; again in %gs", claim.job_id, claim.range_id, exc.message, delay)
        await self.store.release_range(claim.range_id, self.replica, not_before=time.time() + delay)

    async def _unstored(self, claim: Claim) -> list[tuple[int, int]]:
        """The range's (position, item) pairs with no page stored yet: what a read still owes."""
        stored = await self.store.stored_positions(claim.job_id, claim.positions)
        return [(pos, item) for pos, item in zip(claim.positions, claim.items, strict=True) if pos not in stored]

    async def _error_pages(self, claim: Claim, todo: list[tuple[int, int]], message: str) -> None:
        for position, item in todo:
            index = item if claim.pdf else position
            await self.store.put_page(claim.job_id, position, PageResult(
                index, 0, 0, "", finish_reason=FinishReason.ERROR, error=message))

    async def _renew(self, claim: Claim, reader: asyncio.Task) -> None:
        """Hold the lease while reading; stop the reading (and the engine's work) when the job is cancelled
        or deleted, or the lease was lost to another replica."""
        while True:
            await asyncio.sleep(self.store.lease / 3)
            status = await self.store.renew(claim.range_id, self.replica)
            if status != "running":
                log.info("job %s range %d stops: %s", claim.job_id, claim.range_id, status or "lease lost")
                reader.cancel()
                return

    async def _maybe_complete(self, job_id: str) -> None:
        job = await self.store.complete_if_done(job_id, retention=self.settings.job_retention)
        if job is not None:
            log.info("job %s %s: %d pages (%d failed)", job.id, job.status, job.pages_done, job.pages_failed)
            await self.notify(job)
            if job.output_uri:
                self.export_wake.set()

    # ------------------------------------------------------------------ webhooks, retention, metrics

    async def notify(self, job: JobRecord) -> None:
        """Queue the job's webhook (durably: delivered after a restart too)."""
        if not job.callback_url or self.outbox.signer is None or self.describe is None:
            return
        body = event_body(f"job.{job.status}", self.describe(job), time.time())
        await self.outbox.add(f"{job.id}.{job.status}", job.id, job.callback_url, job.callback_headers, body)

    async def _sweep(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                if deleted := await self.store.sweep(time.time()):
                    log.info("deleted %d jobs past their retention", deleted)
                if self.batches is not None:
                    batches = await self.batches.store.sweep(time.time())
                    files = await self.batches.files.sweep(time.time())
                    if batches or files:
                        log.info("deleted %d batches and %d files past their retention", batches, files)
            await asyncio.sleep(min(60.0, self.settings.job_retention / 4))

    def _count_page(self) -> None:
        if self.metrics is not None:
            self.metrics.job_pages.inc()

    async def _refresh_metrics(self) -> None:
        if self.metrics is None:
            return
        counts = await self.store.counts()
        for status in ("queued", "running", "succeeded", "failed", "cancelled"):
            self.metrics.jobs.labels(status).set(counts.get(status, 0))
        if self.batches is not None:
            counts = await self.batches.store.counts()
            for status in (*BATCH_ACTIVE, *BATCH_ENDED):
                self.metrics.batches.labels(status).set(counts.get(status, 0))


def _page_error(exc: HyocrError) -> str:
    return exc.message if exc.public else "the engine failed on this page"
