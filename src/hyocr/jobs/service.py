"""Jobs: what the /v1/jobs routes call. Submission checks a call as a read would (task, media, pages) and
stores it cut into page ranges; the runner reads them later; results are read back from the store.

The Batch API (``files``, ``batches``) and the results written to object storage (``output_uri``) live on
the same database and runner: ``Jobs`` is the one object the api layer holds.

A submit is refused before anything is stored when it reuses an Idempotency-Key for another request (422),
or when its caller already has JOB_MAX_ACTIVE jobs queued or running, or documents of JOB_MAX_STORED_BYTES
waiting in them (429 with Retry-After). The caps are checked and the job stored under one lock per caller
in this process; replicas sharing a database may each admit one submit past them at the same moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass

from ..errors import (
    Conflict,
    IdempotencyKeyReused,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
)
from ..pipeline.objects import ObjectStore
from ..pipeline.pdf_worker import parse_pages
from ..pipeline.service import OcrService
from ..types import OcrCall, OcrResult, PageResult, Task, Usage
from .batch_runner import BatchRunner
from .batch_store import BatchStore
from .batches import Batches
from .codec import request_digest
from .database import database_url
from .exports import JobExports
from .files import Files, FileStore
from .runner import JobRunner
from .store import JobRecord, JobStore
from .webhooks import WebhookSigner, check_callback_url, load_secret

log = logging.getLogger("hyocr.jobs")


@dataclass(frozen=True, slots=True)
class Callback:
    url: str
    headers: dict[str, str] | None = None


class Jobs:
    def __init__(self, store: JobStore, runner: JobRunner, service: OcrService, settings, *,
                 objects: ObjectStore | None = None, result_body=None, answer=None) -> None:
        self.store = store
        self.runner = runner
        self.service = service
        self.settings = settings
        self.objects = objects or ObjectStore.from_settings(settings)
        self.result_body = result_body  # OcrResult -> the /v1/ocr body (api/bodies.ocr_body), for output URIs
        self._submitting: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        file_store = FileStore(store.engine, settings)
        batch_store = BatchStore(store.engine, lease=settings.job_lease)
        self.files = Files(file_store, settings, batch_store)
        self.batches = Batches(batch_store, file_store, self.objects, settings)
        self.batches.wake = runner.batch_wake
        # the runner's other work: a batch's chunks and whole-batch steps, a finished job's output URI
        runner.batches = BatchRunner(batch_store, file_store, self.objects, settings,
                                     replica=runner.replica, answer=answer)
        runner.exports = JobExports(store.engine, self.objects, lease=settings.job_lease,
                                    replica=runner.replica, document=self.document)

    @classmethod
    def from_settings(cls, service: OcrService, settings, *, describe, metrics=None, result_body=None,
                      answer=None) -> Jobs:
        """``describe`` (a job's wire object), ``result_body`` (a result's) and ``answer`` (a batch line
        through its online route's path) come from the api layer, which jobs/ does not import."""
        store = JobStore(database_url(settings), lease=settings.job_lease)
        runner = JobRunner(store, service, settings, describe=describe, metrics=metrics)
        return cls(store, runner, service, settings, result_body=result_body, answer=answer)

    async def open(self) -> None:
        """Open the database (before the engine loads: a wrong URL fails in a second, not after a model
        load). At start, not when the app is built: a generated webhook secret is written by a server that runs."""
        try:
            secret = self.settings.webhook_secret
            self.runner.outbox.signer = WebhookSigner(load_secret(secret.get_secret_value() if secret else None,
                                                           self.settings.data_path))
            await self.store.open()
        except (RuntimeError, ValueError, OSError) as exc:  # the one line an operator needs, before
            log.error("jobs: %s", exc)  # uvicorn's traceback
            raise

    def webhook_secret(self, owner: str) -> str:
        """The secret ``owner``'s webhook receivers verify with: its own (webhooks.WebhookSigner)."""
        signer = self.runner.outbox.signer
        if signer is None:  # the jobs are not open yet (a request before start-up finished)
            raise ServiceUnavailable("the jobs API is starting")
        return signer.owner_secret(owner)

    def start(self) -> None:
        """Start reading, once the engine is up: stored jobs resume (their ranges are pending, or free once
        the lease of the process that held them ends)."""
        self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()
        await self.store.close()

    async def submit(self, owner: str, call: OcrCall, *, idempotency_key: str | None,
                     callback: Callback | None, output_uri: str | None = None) -> tuple[JobRecord, bool]:
        """Store a job. Its object URIs (``image: "s3://..."``) are read here, as image URLs are, so a job
        holds its documents; ``output_uri`` (a prefix) receives its result when it ends."""
        limits = self.service.inputs.limits
        digest = await asyncio.to_thread(request_digest, call, callback and (callback.url, callback.headers),
                                         limits, output_uri)
        if idempotency_key is not None and (known := await self.store.get_by_key(owner, idempotency_key)):
            return self._same_request(known, digest), False  # before any work: a retry costs a lookup
        if output_uri is not None:
            output_uri = str(self.objects.checked(output_uri, param="output_uri", prefix=True))
        if callback is not None:
            await check_callback_url(callback.url, self.service.inputs.fetch_policy)
        call = await self.objects.fetch_media(call, max_bytes=max(limits.max_image_bytes,
                                                                  limits.max_pdf_bytes))
        surveyed = await self.service.survey(call)
        if surveyed.pdf:
            items = list(parse_pages(surveyed.call.pages, surveyed.pages, self.settings.job_max_pages))
        else:
            items = list(range(surveyed.pages))
        range_pages = self.settings.job_range_pages if surveyed.pdf else min(
            self.settings.job_range_pages, self.settings.max_images_per_request)
        lock = self._submitting.setdefault(owner, asyncio.Lock())
        async with lock:
            await self._within_caps(owner, sum(len(m.data) for m in surveyed.call.media))
            job, created = await self.store.submit(
                owner=owner, idempotency_key=idempotency_key, request_digest=digest, call=surveyed.call,
                pdf=surveyed.pdf, items=items, range_pages=range_pages, task=surveyed.task.value,
                requested_task=surveyed.requested_task.value, model=surveyed.model,
                engine=self.service.engine.info.name, callback_url=callback.url if callback else None,
                callback_headers=callback.headers if callback else None, output_uri=output_uri)
        self.runner.wake.set()
        return (job, True) if created else (self._same_request(job, digest), False)

    @staticmethod
    def _same_request(known: JobRecord, digest: str) -> JobRecord:
        """The job a reused Idempotency-Key names, when the request is the one that made it."""
        if known.request_digest is not None and known.request_digest != digest:
            raise IdempotencyKeyReused(f"this Idempotency-Key was used for another request (job {known.id}); "
                                       "use a new key for a new request", param="Idempotency-Key")
        return known

    async def _within_caps(self, owner: str, new_bytes: int) -> None:
        active, stored = await self.store.backlog(owner)
        cap, room = self.settings.job_max_active, self.settings.job_max_stored_bytes
        if active >= cap:
            raise RateLimited(f"{active} of your jobs are queued or running, the most this server keeps per "
                              "caller; submit more as they finish", code="too_many_jobs",
                              headers={"Retry-After": "10"})
        if new_bytes > room:
            raise PayloadTooLarge(f"this job's documents ({new_bytes} bytes) are more than the {room} bytes this "
                                  "server keeps per caller", param="image")
        if stored + new_bytes > room:
            raise RateLimited(f"your queued and running jobs hold {stored} bytes of documents; this one "
                              f"({new_bytes} bytes) would pass the {room} bytes kept per caller; submit it as "
                              "they finish", code="too_many_job_bytes", headers={"Retry-After": "10"})

    async def get(self, owner: str, job_id: str) -> JobRecord:
        job = await self.store.get(owner, job_id)
        if job is None:  # another caller's job is not found either: its existence is not theirs to know
            raise NotFound(f"no job {job_id[:80]!r}", param="job_id", code="job_not_found")
        return job

    async def result(self, owner: str, job_id: str) -> OcrResult:
        job = await self.get(owner, job_id)
        if job.status in ("queued", "running"):
            raise Conflict(f"job {job.id} is {job.status}: {job.pages_done} of {job.pages_total} pages read",
                           code="job_not_finished", headers={"Retry-After": "2"})
        if job.status != "succeeded":
            message = (job.error or {}).get("message")  # a cancelled job has none: "job X cancelled", once
            raise Conflict(f"job {job.id} {job.status}" + (f": {message}" if message else ""),
                           code=f"job_{job.status}")
        return await self._result(job)

    async def _result(self, job: JobRecord) -> OcrResult:
        pages = tuple(await self.store.result_pages(job.id))
        usage = sum((p.usage for p in pages), Usage())
        elapsed = ((job.finished_at or time.time()) - (job.started_at or job.created_at)) * 1000
        return OcrResult(id=job.id, model=job.model, engine=job.engine, task=Task(job.task),
                         requested_task=Task(job.requested_task), pages=pages, usage=usage,
                         timings={"queued_ms": round(((job.started_at or job.created_at) - job.created_at) * 1000, 2),
                                  "total_ms": round(elapsed, 2)})

    async def document(self, job_id: str) -> tuple[dict | None, JobRecord]:
        """A finished job's result body for its output URI (error pages included; None when cancelled)."""
        job = await self.store.get(None, job_id)
        if job.status == "cancelled" or self.result_body is None:
            return None, job
        return self.result_body(await self._result(job)), job

    async def pages(self, owner: str, job_id: str, *, after: int, limit: int
                    ) -> tuple[list[tuple[int, int, PageResult]], bool]:
        job = await self.get(owner, job_id)
        return await self.store.pages_after(job.id, after, limit)

    async def cancel_or_delete(self, owner: str, job_id: str) -> JobRecord | None:
        """An active job is cancelled (returned, cancelled; its webhook queued); a finished one deleted (None)."""
        job = await self.get(owner, job_id)
        if not job.finished and (cancelled := await self._cancel(owner, job_id)) is not None:
            return cancelled
        await self.store.delete(owner, job_id)
        return None

    async def cancel(self, owner: str, job_id: str) -> JobRecord:
        """An active job cancelled; a finished one as it is. Idempotent, unlike DELETE: a retry of a cancel
        whose answer was lost finds the job cancelled and leaves it, where DELETE would delete it."""
        job = await self.get(owner, job_id)
        if not job.finished and (cancelled := await self._cancel(owner, job_id)) is not None:
            return cancelled
        return await self.get(owner, job_id)

    async def _cancel(self, owner: str, job_id: str) -> JobRecord | None:
        if not await self.store.cancel(owner, job_id, self.settings.job_retention):
            return None  # it ended meanwhile
        self.runner.stop_job(job_id)  # the engine's work stops now
        cancelled = await self.get(owner, job_id)
        await self.runner.notify(cancelled)
        return cancelled

    async def list(self, owner: str, *, limit: int, after: str | None) -> tuple[list[JobRecord], bool]:
        if not 1 <= limit <= 100:
            raise InvalidRequest("limit must be 1 to 100", param="limit")
        return await self.store.list(owner, limit=limit, after=after)
