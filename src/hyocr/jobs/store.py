"""JobStore: every read and write of the jobs database, one short transaction each.

SQLite (WAL, the default, under DATA_DIR) or PostgreSQL (several replicas on one database): the same
statements, with the two guarantees the jobs rest on made by the database itself: a range is claimed by
a conditional UPDATE (one winner), and a page is stored under a unique (job, position) key (once).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import and_, delete, event, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..types import MediaInput, OcrCall, PageResult
from . import codec, database, paging
from .schema import deliveries, inputs, jobs, pages, ranges

log = logging.getLogger(__name__)
ACTIVE = ("queued", "running")


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    owner: str
    status: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    expires_at: float | None
    pages_total: int
    pages_done: int
    pages_failed: int
    task: str
    requested_task: str
    model: str
    engine: str
    pdf: bool
    error: dict | None
    callback_url: str | None
    callback_headers: dict | None
    queue_position: int | None = None  # queued: how many of the owner's own queued jobs are ahead
    request_digest: str | None = None  # codec.request_digest of the submit (None: stored by an older hyocr)
    output_uri: str | None = None  # where the result is written when the job ends (jobs/exports.py)
    output_state: str | None = None  # pending | writing | written | failed
    output_error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status not in ACTIVE


@dataclass(frozen=True, slots=True)
class Claim:
    """A range this replica holds: read ``call`` (its media loaded) and store the pages at ``positions``."""

    range_id: int
    job_id: str
    positions: tuple[int, ...]
    items: tuple[int, ...]
    attempts: int
    pdf: bool
    call: OcrCall
    pages_total: int = 0  # the job's: a document of one page is read as one request (its failure says why)


class JobStore:
    def __init__(self, url: str, *, lease: float = 30.0) -> None:
        self.url = url
        self.lease = lease
        self.sqlite = url.startswith("sqlite")
        try:
            self.engine: AsyncEngine = create_async_engine(
                url, connect_args={"timeout": 30} if self.sqlite else {}, pool_pre_ping=not self.sqlite)
        except ImportError as exc:  # asyncpg: the postgres extra
            raise RuntimeError(f"the jobs database needs {exc.name}: pip install 'hyocr[postgres]'") from None
        if self.sqlite:
            event.listen(self.engine.sync_engine, "connect", database.sqlite_pragmas)

    async def open(self) -> None:
        """Create the tables if missing. An unreachable database stops the server with one clear line."""
        await database.create_schema(self.engine, self.url)

    async def close(self) -> None:
        await self.engine.dispose()

    # ------------------------------------------------------------------ submission and reading

    async def submit(self, *, owner: str, idempotency_key: str | None, call: OcrCall, pdf: bool,
                     items: list[int], range_pages: int, task: str, requested_task: str, model: str,
                     engine: str, callback_url: str | None, callback_headers: dict | None,
                     request_digest: str | None = None, output_uri: str | None = None
                     ) -> tuple[JobRecord, bool]:
        """(the job, whether it is new): a key already used by this owner returns that job (the caller
        compares its ``request_digest``)."""
        if idempotency_key is not None and (known := await self.get_by_key(owner, idempotency_key)) is not None:
            return known, False
        job_id = f"job-{uuid.uuid4().hex}"
        try:
            async with self.engine.begin() as db:
                await db.execute(insert(jobs).values(
                    id=job_id, owner=owner, idempotency_key=idempotency_key, request_digest=request_digest,
                    status="queued",
                    created_at=time.time(), call=codec.call_to_json(call), pdf=int(pdf), pages_total=len(items),
                    task=task, requested_task=requested_task, model=model, engine=engine,
                    callback_url=callback_url, callback_headers=callback_headers, output_uri=output_uri,
                    output_state="pending" if output_uri else None))
                await db.execute(insert(inputs), [{"job_id": job_id, "n": n, "param": m.param, "data": m.data}
                                                  for n, m in enumerate(call.media)])
                await db.execute(insert(ranges), [
                    {"job_id": job_id, "positions": list(range(i, min(i + range_pages, len(items)))),
                     "items": items[i:i + range_pages], "state": "pending", "attempts": 0, "not_before": 0.0}
                    for i in range(0, len(items), range_pages)])
        except IntegrityError:  # the same key submitted at the same moment: the other one won
            if idempotency_key is not None and (known := await self.get_by_key(owner, idempotency_key)):
                return known, False
            raise
        return await self.get(owner, job_id), True

    async def get_by_key(self, owner: str, key: str) -> JobRecord | None:
        async with self.engine.connect() as db:
            job_id = await db.scalar(select(jobs.c.id).where(jobs.c.owner == owner, jobs.c.idempotency_key == key))
        return await self.get(owner, job_id) if job_id else None

    async def get(self, owner: str | None, job_id: str) -> JobRecord | None:
        """The job, if ``owner`` owns it (None: whoever does)."""
        found = await self._records(jobs.c.id == job_id if owner is None
                                    else and_(jobs.c.id == job_id, jobs.c.owner == owner), limit=1)
        return found[0] if found else None

    async def list(self, owner: str, *, limit: int, after: str | None) -> tuple[list[JobRecord], bool]:
        """The owner's jobs, newest first, after the job ``after`` (a cursor from the previous page)."""
        where = jobs.c.owner == owner
        if after is not None:
            if (past := await paging.after(self.engine, jobs, owner, after)) is None:
                return [], False
            where = and_(where, past)
        found = await self._records(where, limit=limit + 1)
        return found[:limit], len(found) > limit

    async def _records(self, where, *, limit: int) -> list[JobRecord]:
        counts = (select(pages.c.job_id, func.count().label("done"), func.sum(pages.c.failed).label("failed"))
                  .group_by(pages.c.job_id).subquery())
        query = (select(jobs, counts.c.done, counts.c.failed).outerjoin(counts, counts.c.job_id == jobs.c.id)
                 .where(where).order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit))
        async with self.engine.connect() as db:
            rows = (await db.execute(query)).mappings().all()
            out = []
            for row in rows:
                position = None
                if row["status"] == "queued":  # the owner's own jobs only: others' load is not theirs to see
                    position = await db.scalar(select(func.count()).select_from(jobs).where(
                        jobs.c.owner == row["owner"], jobs.c.status == "queued",
                        jobs.c.created_at < row["created_at"]))
                out.append(_record(row, position))
        return out

    async def backlog(self, owner: str) -> tuple[int, int]:
        """(the owner's queued and running jobs, the bytes of documents they hold): what the per-caller caps
        count. Finished jobs hold none: their inputs are deleted when they end."""
        async with self.engine.connect() as db:
            active = await db.scalar(select(func.count()).select_from(jobs).where(
                jobs.c.owner == owner, jobs.c.status.in_(ACTIVE)))
            stored = await db.scalar(select(func.coalesce(func.sum(func.length(inputs.c.data)), 0))
                                     .select_from(inputs.join(jobs, jobs.c.id == inputs.c.job_id))
                                     .where(jobs.c.owner == owner, jobs.c.status.in_(ACTIVE)))
        return int(active or 0), int(stored or 0)

    async def pages_after(self, job_id: str, after: int, limit: int) -> tuple[list[tuple[int, int, PageResult]], bool]:
        """Stored pages in the order they were stored: (seq, position, page), and whether there are more."""
        async with self.engine.connect() as db:
            rows = (await db.execute(select(pages.c.seq, pages.c.position, pages.c.result).where(
                pages.c.job_id == job_id, pages.c.seq > after).order_by(pages.c.seq).limit(limit + 1))).all()
        return [(r.seq, r.position, codec.page_from_json(r.result)) for r in rows[:limit]], len(rows) > limit

    async def result_pages(self, job_id: str) -> list[PageResult]:
        async with self.engine.connect() as db:
            rows = (await db.execute(select(pages.c.result).where(pages.c.job_id == job_id)
                                     .order_by(pages.c.position))).all()
        return [codec.page_from_json(r.result) for r in rows]

    # ------------------------------------------------------------------ cancel, delete, retention

    async def cancel(self, owner: str, job_id: str, retention: float) -> bool:
        """Cancel an active job (True), its inputs gone; its running ranges stop at their next renewal."""
        now = time.time()
        async with self.engine.begin() as db:
            done = await db.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.owner == owner,
                                                       jobs.c.status.in_(ACTIVE))
                                    .values(status="cancelled", finished_at=now, expires_at=now + retention))
            if done.rowcount:
                await db.execute(delete(inputs).where(inputs.c.job_id == job_id))
            return bool(done.rowcount)

    async def delete(self, owner: str, job_id: str) -> bool:
        async with self.engine.begin() as db:
            found = await db.scalar(select(jobs.c.id).where(jobs.c.id == job_id, jobs.c.owner == owner))
            if found:
                await _delete_jobs(db, [job_id])
            return bool(found)

    async def sweep(self, now: float) -> int:
        """Delete the jobs past their retention, with everything they kept."""
        async with self.engine.begin() as db:
            expired = (await db.scalars(select(jobs.c.id).where(jobs.c.expires_at < now).limit(500))).all()
            await _delete_jobs(db, list(expired))
        return len(expired)

    async def counts(self) -> dict[str, int]:
        async with self.engine.connect() as db:
            rows = (await db.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))).all()
        return {status: n for status, n in rows}

    # ------------------------------------------------------------------ running ranges

    async def claim(self, replica: str, *, max_running: int) -> Claim | None:
        """The next range to read, held for ``lease`` seconds: a pending one, or one whose holder stopped
        renewing (a replica that died). Jobs of owners at ``max_running`` running jobs wait. Owners take turns:
        the owner with the fewest ranges being read goes first (oldest job first among equals), so one caller's
        long jobs do not hold every worker while another's queued job waits for them to end."""
        now = time.time()
        claimable = or_(ranges.c.state == "pending", and_(ranges.c.state == "running", ranges.c.lease_until < now))
        j2, j3, r2 = jobs.alias("j2"), jobs.alias("j3"), ranges.alias("r2")
        busy = select(func.count()).select_from(j2).where(j2.c.owner == jobs.c.owner,
                                                          j2.c.status == "running").scalar_subquery()
        reading = (select(func.count()).select_from(r2.join(j3, j3.c.id == r2.c.job_id))
                   .where(j3.c.owner == jobs.c.owner, r2.c.state == "running", r2.c.lease_until >= now)
                   .scalar_subquery())
        query = (select(ranges.c.id, ranges.c.job_id).join(jobs, jobs.c.id == ranges.c.job_id)
                 .where(claimable, ranges.c.not_before <= now,
                        or_(jobs.c.status == "running", and_(jobs.c.status == "queued", busy < max_running)))
                 .order_by(reading, jobs.c.created_at, ranges.c.id).limit(8))
        async with self.engine.begin() as db:
            for range_id, job_id in (await db.execute(query)).all():
                won = await db.execute(update(ranges).where(ranges.c.id == range_id, claimable).values(
                    state="running", lease_until=now + self.lease, claimed_by=replica,
                    attempts=ranges.c.attempts + 1))
                if not won.rowcount:
                    continue  # another replica took it between the two statements
                await db.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == "queued")
                                 .values(status="running", started_at=now))
                return await _claim(db, range_id)
        return None

    async def renew(self, range_id: int, replica: str) -> str | None:
        """Extend the lease; the job's status (None: the range is no longer this replica's, or the job is gone)."""
        async with self.engine.begin() as db:
            held = await db.execute(update(ranges).where(ranges.c.id == range_id, ranges.c.claimed_by == replica,
                                                         ranges.c.state == "running")
                                    .values(lease_until=time.time() + self.lease))
            if not held.rowcount:
                return None
            return await db.scalar(select(jobs.c.status).join(ranges, ranges.c.job_id == jobs.c.id)
                                   .where(ranges.c.id == range_id))

    async def stored_positions(self, job_id: str, positions: tuple[int, ...]) -> set[int]:
        async with self.engine.connect() as db:
            return set((await db.scalars(select(pages.c.position).where(
                pages.c.job_id == job_id, pages.c.position.in_(positions)))).all())

    async def put_page(self, job_id: str, position: int, page: PageResult) -> bool:
        """Store a page's result once: False when this position was stored already."""
        try:
            async with self.engine.begin() as db:
                await db.execute(insert(pages).values(job_id=job_id, position=position,
                                                      failed=int(page.error is not None and not page.text),
                                                      result=codec.page_to_json(page)))
        except IntegrityError:
            return False
        return True

    async def finish_range(self, range_id: int, replica: str) -> None:
        async with self.engine.begin() as db:
            await db.execute(update(ranges).where(ranges.c.id == range_id, ranges.c.claimed_by == replica)
                             .values(state="done", lease_until=None))

    async def release_range(self, range_id: int, replica: str, *, not_before: float = 0.0,
                            tried: bool = True) -> None:
        """Give a range back: pending, not before ``not_before``. ``tried=False`` (a replica stopping, not
        the range failing) does not count the attempt against JOB_MAX_ATTEMPTS."""
        attempts = ranges.c.attempts if tried else ranges.c.attempts - 1
        async with self.engine.begin() as db:
            await db.execute(update(ranges).where(ranges.c.id == range_id, ranges.c.claimed_by == replica,
                                                  ranges.c.state == "running")
                             .values(state="pending", lease_until=None, not_before=not_before, attempts=attempts))

    async def complete_if_done(self, job_id: str, *, retention: float) -> JobRecord | None:
        """End the job once every range is done (exactly once, whoever finishes last): succeeded, or failed
        when every page failed. Its inputs go; its webhook, if any, is queued. Returns the ended job."""
        now = time.time()
        async with self.engine.begin() as db:
            left = await db.scalar(select(func.count()).select_from(ranges).where(
                ranges.c.job_id == job_id, ranges.c.state != "done"))
            if left:
                return None
            total, failed = (await db.execute(select(func.count(), func.sum(pages.c.failed))
                                              .where(pages.c.job_id == job_id))).one()
            status = "failed" if total and failed == total else "succeeded"
            error = None
            if status == "failed":  # why, in the first page's words (a one-page document: the whole reason)
                first = await db.scalar(select(pages.c.result).where(pages.c.job_id == job_id)
                                        .order_by(pages.c.position).limit(1))
                why = str((first or {}).get("error") or "")[:500]
                error = {"message": "every page failed" + (f"; the first: {why}" if why else ""),
                         "type": "job_error", "code": "all_pages_failed"}
            ended = await db.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == "running").values(
                status=status, finished_at=now, expires_at=now + retention, error=error))
            if not ended.rowcount:
                return None
            await db.execute(delete(inputs).where(inputs.c.job_id == job_id))
        return await self.get(None, job_id)

async def _claim(db, range_id: int) -> Claim:
    row = (await db.execute(select(ranges, jobs.c.call, jobs.c.pdf, jobs.c.pages_total)
                            .join(jobs, jobs.c.id == ranges.c.job_id).where(ranges.c.id == range_id))).mappings().one()
    items = tuple(row["items"])
    pdf = bool(row["pdf"])
    wanted = [0] if pdf else list(items)
    media = (await db.execute(select(inputs.c.n, inputs.c.param, inputs.c.data).where(
        inputs.c.job_id == row["job_id"], inputs.c.n.in_(wanted)))).all()
    by_n = {n: MediaInput(bytes(data), param) for n, param, data in media}
    call = replace(codec.call_from_json(row["call"]), media=tuple(by_n[n] for n in wanted if n in by_n))
    return Claim(row["id"], row["job_id"], tuple(row["positions"]), items, row["attempts"], pdf, call,
                 row["pages_total"] or 0)


async def _delete_jobs(db, job_ids: list[str]) -> None:
    if not job_ids:
        return
    for table in (pages, ranges, inputs):
        await db.execute(delete(table).where(table.c.job_id.in_(job_ids)))
    await db.execute(delete(deliveries).where(deliveries.c.job_id.in_(job_ids)))
    await db.execute(delete(jobs).where(jobs.c.id.in_(job_ids)))


def _record(row: Any, position: int | None) -> JobRecord:
    return JobRecord(
        id=row["id"], owner=row["owner"], status=row["status"], created_at=row["created_at"],
        started_at=row["started_at"], finished_at=row["finished_at"], expires_at=row["expires_at"],
        pages_total=row["pages_total"], pages_done=row["done"] or 0, pages_failed=int(row["failed"] or 0),
        task=row["task"], requested_task=row["requested_task"], model=row["model"], engine=row["engine"],
        pdf=bool(row["pdf"]), error=row["error"], callback_url=row["callback_url"],
        callback_headers=row["callback_headers"], queue_position=position, request_digest=row["request_digest"],
        output_uri=row["output_uri"], output_state=row["output_state"], output_error=row["output_error"],
    )
