"""Results written to the object store the caller named (``output_uri``, a prefix): one object per document
and a ``manifest.json`` saying what was written where, and what could not be.

A job is one document: ``<prefix>result.json`` (the /v1/ocr body of its result, error pages included) and
``<prefix>manifest.json``. A batch writes one object per line, ``<prefix><custom_id>.json`` (the response
body of a line that succeeded, the error line of one that did not; the custom_id percent-encoded), and
``<prefix>manifest.json``. The results stay in the database (and the batch's output files) whatever the
store does: a write it refuses (a missing bucket, a policy that denies it) is recorded per object and in the
job's or batch's ``output`` outcome, and nothing is lost. Each write is tried ``ATTEMPTS`` times.

A job's export is claimed in the database (``output_state`` writing, with a lease), so one replica writes
it, and one that dies mid-way leaves it to be written again: objects are overwritten whole, never doubled.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from urllib.parse import quote

from sqlalchemy import and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import HyocrError
from ..pipeline.objects import ObjectStore, ObjectUri, ObjectWriteError, parse_object_uri
from .codec import json_bytes
from .loops import passes
from .schema import jobs

log = logging.getLogger("hyocr.jobs")
ATTEMPTS = 3
CONCURRENCY = 8  # objects written at once for a batch
MANIFEST = "manifest.json"
MAX_REPORTED = 100
_FINISHED = ("succeeded", "failed", "cancelled")


NAME_CHARS = 200  # of an object's name: S3 takes 1024 bytes of key, and 512 characters of CJK custom_id
# percent-encode to 4.6 kB (moto accepts it; S3 would refuse every such object at export)


def object_name(custom_id: str) -> str:
    """A line's object name: its custom_id percent-encoded (no ``/``, so no key escapes the prefix), never
    the manifest's name; a long one cut, with a hash of the whole id to keep it unique (the manifest maps
    each custom_id to its object)."""
    name = quote(custom_id, safe="-_.~")
    if name == "manifest":
        name = "%6Danifest"
    if len(name) > NAME_CHARS:
        kept, size = [], 0
        for char in custom_id:  # whole characters, each as its escapes
            part = quote(char, safe="-_.~")
            if size + len(part) > NAME_CHARS - 17:
                break
            kept.append(part)
            size += len(part)
        name = f"{''.join(kept)}~{hashlib.sha256(custom_id.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    return f"{name}.json"


def _prefix(uri: str) -> tuple[ObjectUri | None, str | None]:
    """The output prefix, or why it cannot be one (a URI stored before today's checks): a failed export,
    said once, not one retried for ever."""
    try:
        return parse_object_uri(uri, prefix=True), None
    except HyocrError as exc:
        return None, exc.message


async def write(objects: ObjectStore, uri: ObjectUri, body: object) -> str | None:
    """Write ``body`` as JSON; None, or why the store refused it after ATTEMPTS tries."""
    data = json_bytes(body)
    for attempt in range(ATTEMPTS):
        try:
            await objects.write(uri, data)
            return None
        except ObjectWriteError as exc:
            if attempt == ATTEMPTS - 1:
                return str(exc)
            await asyncio.sleep(0.5 * 2**attempt)
    return None


async def export_batch(batch, store, objects: ObjectStore, *, page: int = 500) -> dict:
    """Each answered line to its object, then the manifest; the outcome for the batch's ``output_export``."""
    prefix, invalid = _prefix(batch.output_uri)
    if prefix is None:
        log.warning("batch %s output failed: %s", batch.id, invalid)
        return {"status": "failed", "manifest": None, "written": 0, "failed": 0, "error": invalid, "refused": []}
    entries: list[dict] = []
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(n: int, custom_id: str | None, status: int, answer: dict) -> dict:
        entry = {"line": n, "custom_id": custom_id, "status_code": status or None, "object": None,
                 "error": None}
        if custom_id is None:  # a line that was not a request names no object
            entry["error"] = (answer.get("error") or {}).get("message")
            return entry
        ok = 200 <= status < 300
        uri = prefix.child(object_name(custom_id))
        async with gate:
            failed = await write(objects, uri, answer["response"]["body"] if ok else answer)
        entry.update(object=None if failed else str(uri), error=failed)
        return entry

    after = 0
    while found := await store.answers(batch.id, after=after, limit=page):
        entries += await asyncio.gather(*(one(*row) for row in found))
        after = found[-1][0]
    written = sum(1 for e in entries if e["object"])
    refused = [e for e in entries if e["custom_id"] is not None and not e["object"]]
    manifest = {"object": "batch.manifest", "batch": batch.id, "endpoint": batch.endpoint,
                "request_counts": {"total": batch.total, "completed": batch.completed,
                                   "failed": batch.failed},
                "written_at": int(time.time()), "lines": entries}
    failed = await write(objects, prefix.child(MANIFEST), manifest)
    outcome = {"status": "written" if not failed and not refused else "failed",
               "manifest": None if failed else str(prefix.child(MANIFEST)), "written": written,
               "failed": len(refused), "error": failed or (refused[0]["error"] if refused else None),
               # each object refused, by line (the first MAX_REPORTED; the manifest, if written, has all)
               "refused": [{"line": e["line"], "custom_id": e["custom_id"], "error": e["error"]}
                           for e in refused[:MAX_REPORTED]]}
    log.info("batch %s output %s: %d objects written, %d refused", batch.id, outcome["status"], written,
             len(refused))
    return outcome


class JobExports:
    """Writes a finished job's result to its ``output_uri``; runs in the JobRunner's loops."""

    def __init__(self, engine: AsyncEngine, objects: ObjectStore, *, lease: float, replica: str,
                 document: Callable) -> None:
        self.engine = engine
        self.objects = objects
        self.lease = lease
        self.replica = replica
        self.document = document  # async (job) -> the /v1/ocr body of its result (the api layer's ocr_body)

    async def run(self, poll: float, wake: asyncio.Event) -> None:
        async def one_pass() -> bool:
            worked = False
            while (job_id := await self._claim()) is not None:
                await self._export(job_id)
                worked = True
            return worked

        await passes(one_pass, wake, poll, "job output")

    async def _claim(self) -> str | None:
        now = time.time()
        due = and_(jobs.c.output_uri.is_not(None), jobs.c.status.in_(_FINISHED),
                   or_(jobs.c.output_state == "pending",
                       and_(jobs.c.output_state == "writing", jobs.c.output_lease_until < now)))
        async with self.engine.begin() as db:
            found = (await db.scalars(select(jobs.c.id).where(due).order_by(jobs.c.finished_at)
                                      .limit(8))).all()
            for job_id in found:
                # held for the whole export (3 tries of two objects): a replica that died leaves it after that
                won = await db.execute(update(jobs).where(jobs.c.id == job_id, due).values(
                    output_state="writing", output_lease_until=now + max(self.lease, 120.0)))
                if won.rowcount:
                    return job_id
        return None

    async def _export(self, job_id: str) -> None:
        body, job = await self.document(job_id)
        prefix, failed = _prefix(job.output_uri)
        if prefix is None:
            body = None
        elif body is not None:
            failed = await write(self.objects, prefix.child("result.json"), body)
        manifest = {"object": "ocr.job.manifest", "job": job.id, "status": job.status,
                    "pages": {"total": job.pages_total, "done": job.pages_done, "failed": job.pages_failed},
                    "result": None if body is None or failed else str(prefix.child("result.json")),
                    "error": failed, "created_at": int(job.created_at),
                    "finished_at": int(job.finished_at) if job.finished_at else None}
        failed = failed or await write(self.objects, prefix.child(MANIFEST), manifest)  # type: ignore[union-attr]
        async with self.engine.begin() as db:
            await db.execute(update(jobs).where(jobs.c.id == job_id).values(
                output_state="failed" if failed else "written", output_error=failed and failed[:1024],
                output_lease_until=None))
        log.info("job %s output %s%s", job_id, "failed: " if failed else "written to ",
                 failed or job.output_uri)
