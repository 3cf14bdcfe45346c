"""BatchStore: the OpenAI batches in the jobs database, with the jobs' two guarantees.

A batch's lines are read in chunks (JOB_RANGE_PAGES lines), each claimed by one replica with a lease, as a
job's ranges are; a line's answer is set once, from NULL, by a conditional UPDATE, so a chunk read again after
a crash answers only its open lines and never one twice. The work on a batch as a whole (validating its
input file, finalizing its output files) is held by a lease on the batch row, so one replica does it and a
dead replica's claim runs out.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import and_, bindparam, case, delete, exists, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from . import paging
from .schema import batch_chunks, batch_lines, batches

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
BATCH_ID = re.compile(r"batch_[0-9a-f]{32}")  # anything else is no batch of ours (checked before the database)
ENDED = ("failed", "completed", "expired", "cancelled")
CLOSE_GROUP = 1000  # open lines closed in one transaction when a batch is cancelled or expires


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    owner: str
    status: str
    ending: str | None
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict | None
    errors: list | None
    output_file_id: str | None
    error_file_id: str | None
    output_uri: str | None
    output_expires_after: int | None
    export: dict | None
    total: int
    created_at: float
    in_progress_at: float | None
    expires_at: float
    finalizing_at: float | None
    completed_at: float | None
    failed_at: float | None
    expired_at: float | None
    cancelling_at: float | None
    cancelled_at: float | None
    completed: int = 0  # lines answered 2xx
    failed: int = 0  # lines answered otherwise
    prompt_tokens: int = 0
    completion_tokens: int = 0


_COUNTS = ("completed", "failed", "prompt_tokens", "completion_tokens")
_COLUMNS = tuple(f.name for f in fields(BatchRecord) if f.name not in _COUNTS)


@dataclass(frozen=True, slots=True)
class OpenLine:
    n: int
    custom_id: str
    request: bytes


@dataclass(frozen=True, slots=True)
class ChunkClaim:
    chunk_id: int
    batch_id: str
    endpoint: str
    attempts: int
    lines: tuple[OpenLine, ...]  # the chunk's lines not answered yet


class BatchStore:
    def __init__(self, engine: AsyncEngine, *, lease: float = 30.0) -> None:
        self.engine = engine
        self.lease = lease

    # ------------------------------------------------------------------ the batch object

    async def create(self, *, owner: str, endpoint: str, input_file_id: str, completion_window: str,
                     metadata: dict | None, output_uri: str | None, output_expires_after: int | None,
                     window: float) -> BatchRecord:
        batch_id, now = f"batch_{uuid.uuid4().hex}", time.time()
        async with self.engine.begin() as db:
            await db.execute(insert(batches).values(
                id=batch_id, owner=owner, status="validating", endpoint=endpoint, input_file_id=input_file_id,
                completion_window=completion_window, metadata=metadata, output_uri=output_uri,
                output_expires_after=output_expires_after, total=0, created_at=now, expires_at=now + window))
        return await self.get(owner, batch_id)

    async def get(self, owner: str | None, batch_id: str) -> BatchRecord | None:
        if not BATCH_ID.fullmatch(batch_id):
            return None
        where = batches.c.id == batch_id if owner is None else and_(batches.c.id == batch_id,
                                                                     batches.c.owner == owner)
        found = await self._records(where, limit=1)
        return found[0] if found else None

    async def list(self, owner: str, *, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        """The owner's batches, newest first, after the batch ``after`` (the previous page's last id)."""
        where = batches.c.owner == owner
        if after is not None and not BATCH_ID.fullmatch(after):
            return [], False
        if after is not None:
            if (past := await paging.after(self.engine, batches, owner, after)) is None:
                return [], False
            where = and_(where, past)
        found = await self._records(where, limit=limit + 1)
        return found[:limit], len(found) > limit

    async def _records(self, where, *, limit: int) -> list[BatchRecord]:
        """The batches ``where`` selects, newest first, with their request counts (counted for these batches
        only, on the (batch, status_code) index: never a scan of every batch's lines)."""
        query = (select(*(batches.c[name] for name in _COLUMNS)).where(where)
                 .order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit))
        good = and_(batch_lines.c.status_code >= 200, batch_lines.c.status_code < 300)
        async with self.engine.connect() as db:
            rows = (await db.execute(query)).mappings().all()
            ids = [row["id"] for row in rows]
            counts = {r.batch_id: r for r in (await db.execute(
                select(batch_lines.c.batch_id,
                       func.sum(case((good, 1), else_=0)).label("completed"),
                       func.sum(case((and_(batch_lines.c.status_code.is_not(None), ~good), 1), else_=0))
                       .label("failed"),
                       func.sum(func.coalesce(batch_lines.c.prompt_tokens, 0)).label("prompt_tokens"),
                       func.sum(func.coalesce(batch_lines.c.completion_tokens, 0)).label("completion_tokens"))
                .where(batch_lines.c.batch_id.in_(ids), batch_lines.c.status_code.is_not(None))
                .group_by(batch_lines.c.batch_id))).all()} if ids else {}
        return [BatchRecord(**{name: row[name] for name in _COLUMNS},
                            **{k: int(getattr(counts[row["id"]], k) or 0) if row["id"] in counts else 0
                               for k in _COUNTS}) for row in rows]

    async def active(self, owner: str) -> int:
        async with self.engine.connect() as db:
            return int(await db.scalar(select(func.count()).select_from(batches).where(
                batches.c.owner == owner, batches.c.status.in_(ACTIVE))) or 0)

    async def held_bytes(self, owner: str) -> tuple[int, list[str]]:
        """(the owner's active batches' request bytes in open lines, the inputs of those still validating)."""
        active = and_(batches.c.owner == owner, batches.c.status.in_(ACTIVE))
        async with self.engine.connect() as db:
            held = await db.scalar(select(func.coalesce(func.sum(func.length(batch_lines.c.request)), 0)).where(
                batch_lines.c.batch_id.in_(select(batches.c.id).where(active)), batch_lines.c.request.is_not(None)))
            validating = (await db.scalars(select(batches.c.input_file_id).where(
                active, or_(batches.c.status == "validating", batches.c.total == 0)))).all()
        return int(held or 0), list(validating)

    async def cancel(self, owner: str, batch_id: str) -> bool:
        """validating or in_progress -> cancelling (True); the finalizer ends it once no chunk runs."""
        async with self.engine.begin() as db:
            done = await db.execute(update(batches).where(
                batches.c.id == batch_id, batches.c.owner == owner,
                batches.c.status.in_(("validating", "in_progress"))).values(
                status="cancelling", ending="cancelled", cancelling_at=time.time()))
        return bool(done.rowcount)

    async def sweep(self, now: float) -> int:
        """Delete ended batches past their retention, with their lines and chunks."""
        async with self.engine.begin() as db:
            gone = (await db.scalars(select(batches.c.id).where(batches.c.retain_until < now)
                                     .limit(100))).all()
            if gone:
                for table in (batch_lines, batch_chunks):
                    await db.execute(delete(table).where(table.c.batch_id.in_(gone)))
                await db.execute(delete(batches).where(batches.c.id.in_(gone)))
        return len(gone)

    # ------------------------------------------------------------------ whole-batch work: validate, finalize

    async def claim_batch(self, replica: str) -> BatchRecord | None:
        """A batch with whole-batch work due, held for ``lease`` seconds: one validating, one whose chunks are
        all done or whose window passed, one cancelling with no chunk still held, one left finalizing."""
        now = time.time()
        free = or_(batches.c.lease_until.is_(None), batches.c.lease_until < now)
        chunk = batch_chunks.alias("c")
        open_chunk = exists().where(chunk.c.batch_id == batches.c.id, chunk.c.state != "done")
        held_chunk = exists().where(chunk.c.batch_id == batches.c.id, chunk.c.state == "running",
                                    chunk.c.lease_until >= now)
        due = or_(batches.c.status.in_(("validating", "finalizing")),
                  and_(batches.c.status == "in_progress", or_(~open_chunk, batches.c.expires_at <= now)),
                  and_(batches.c.status == "cancelling", ~held_chunk))
        async with self.engine.begin() as db:
            candidates = (await db.scalars(select(batches.c.id).where(free, due)
                                           .order_by(batches.c.created_at).limit(8))).all()
            for batch_id in candidates:
                won = await db.execute(update(batches).where(batches.c.id == batch_id, free).values(
                    lease_until=now + self.lease, claimed_by=replica))
                if won.rowcount:
                    break
            else:
                return None
        return await self.get(None, batch_id)

    async def renew_batch(self, batch_id: str, replica: str) -> bool:
        async with self.engine.begin() as db:
            held = await db.execute(update(batches).where(
                batches.c.id == batch_id, batches.c.claimed_by == replica)
                .values(lease_until=time.time() + self.lease))
        return bool(held.rowcount)

    async def release_batch(self, batch_id: str, replica: str, *, after: float = 0.0) -> None:
        """Give the batch's claim back; free for another try only ``after`` seconds from now."""
        async with self.engine.begin() as db:
            await db.execute(update(batches).where(batches.c.id == batch_id, batches.c.claimed_by == replica)
                             .values(lease_until=time.time() + after if after else None, claimed_by=None))

    async def reset_lines(self, batch_id: str) -> None:
        """Forget the lines a validation that died half-way stored (it starts again from the first)."""
        async with self.engine.begin() as db:
            for table in (batch_lines, batch_chunks):
                await db.execute(delete(table).where(table.c.batch_id == batch_id))

    async def add_lines(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        """Lines of a validation: {n, custom_id, request} to run, or {n, custom_id, status_code, answer}."""
        if rows:
            async with self.engine.begin() as db:
                empty = {"batch_id": batch_id, "request": None, "status_code": None, "answer": None}
                await db.execute(insert(batch_lines), [{**empty, **r} for r in rows])

    async def start(self, batch_id: str, replica: str, *, numbers: list[int], chunk_lines: int) -> bool:
        """validating -> in_progress, its open lines cut into chunks; False if it was cancelled meanwhile."""
        now = time.time()
        async with self.engine.begin() as db:
            begun = await db.execute(update(batches).where(
                batches.c.id == batch_id, batches.c.claimed_by == replica, batches.c.status == "validating")
                .values(status="in_progress", in_progress_at=now, total=len(numbers)))
            if not begun.rowcount:  # cancelled meanwhile: total says its lines are all stored (BatchRunner)
                await db.execute(update(batches).where(
                    batches.c.id == batch_id, batches.c.claimed_by == replica, batches.c.status == "cancelling")
                    .values(total=len(numbers)))
                return False
            open_numbers = (await db.scalars(select(batch_lines.c.n).where(
                batch_lines.c.batch_id == batch_id, batch_lines.c.status_code.is_(None))
                .order_by(batch_lines.c.n))).all()
            chunks = [open_numbers[i:i + chunk_lines] for i in range(0, len(open_numbers), chunk_lines)]
            if chunks:
                await db.execute(insert(batch_chunks), [
                    {"batch_id": batch_id, "first": c[0], "last": c[-1], "state": "pending", "attempts": 0,
                     "not_before": 0.0} for c in chunks])
        return True

    async def fail(self, batch_id: str, replica: str, errors: list[dict], retention: float) -> None:
        now = time.time()
        async with self.engine.begin() as db:
            await db.execute(update(batches).where(batches.c.id == batch_id, batches.c.claimed_by == replica,
                                                   batches.c.status.in_(("validating", "cancelling")))
                             .values(status="failed", failed_at=now, errors=errors,
                                     retain_until=now + retention, lease_until=None, claimed_by=None))
            for table in (batch_lines, batch_chunks):
                await db.execute(delete(table).where(table.c.batch_id == batch_id))

    async def begin_finalizing(self, batch_id: str, replica: str, ending: str) -> None:
        """in_progress -> finalizing, ending in ``ending`` (completed or expired)."""
        async with self.engine.begin() as db:
            await db.execute(update(batches).where(batches.c.id == batch_id, batches.c.claimed_by == replica,
                                                   batches.c.status == "in_progress")
                             .values(status="finalizing", ending=ending, finalizing_at=time.time()))

    async def close_open_lines(self, batch_id: str, code: str, message: str) -> int:
        """Answer every line still open with an error line (``code``: batch_cancelled, batch_expired), and
        close the chunks: a chunk held by a replica that is late answers nothing after this."""
        async with self.engine.begin() as db:
            await db.execute(update(batch_chunks).where(batch_chunks.c.batch_id == batch_id)
                             .values(state="done", lease_until=None))
            rows = (await db.execute(select(batch_lines.c.n, batch_lines.c.custom_id).where(
                batch_lines.c.batch_id == batch_id, batch_lines.c.status_code.is_(None)))).all()
        # One statement a group, each group its own transaction: row by row in one transaction, cancelling
        # 50,000 lines held SQLite's write lock for 11 s, and every caller's writes waited on it.
        closing = update(batch_lines).where(
            batch_lines.c.batch_id == batch_id, batch_lines.c.n == bindparam("line"),
            batch_lines.c.status_code.is_(None)).values(status_code=0, answer=bindparam("closed"), request=None)
        for start in range(0, len(rows), CLOSE_GROUP):
            async with self.engine.begin() as db:
                await db.execute(closing, [
                    {"line": n, "closed": {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
                                           "response": None, "error": {"code": code, "message": message}}}
                    for n, custom_id in rows[start:start + CLOSE_GROUP]])
        return len(rows)

    async def answers(self, batch_id: str, *, after: int, limit: int
                      ) -> list[tuple[int, str | None, int, dict]]:
        """Answered lines in line order: (n, custom_id, status_code, the output line)."""
        columns = (batch_lines.c.n, batch_lines.c.custom_id, batch_lines.c.status_code, batch_lines.c.answer)
        async with self.engine.connect() as db:
            rows = (await db.execute(select(*columns).where(
                batch_lines.c.batch_id == batch_id, batch_lines.c.n > after,
                batch_lines.c.status_code.is_not(None)).order_by(batch_lines.c.n).limit(limit))).all()
        return [(r.n, r.custom_id, r.status_code, r.answer) for r in rows]

    async def finish(self, batch_id: str, replica: str, *, output_file_id: str | None,
                     error_file_id: str | None, export: dict | None, retention: float) -> bool:
        """finalizing or cancelling -> the status it ends in, with its files."""
        now = time.time()
        async with self.engine.begin() as db:
            ending = await db.scalar(select(batches.c.ending).where(batches.c.id == batch_id))
            stamp = f"{ending}_at"  # completed_at, expired_at, cancelled_at
            total = await db.scalar(select(func.count()).select_from(batch_lines).where(
                batch_lines.c.batch_id == batch_id))
            done = await db.execute(update(batches).where(
                batches.c.id == batch_id, batches.c.claimed_by == replica,
                batches.c.status.in_(("finalizing", "cancelling"))).values(
                status=ending, **{stamp: now}, output_file_id=output_file_id, error_file_id=error_file_id,
                export=export, total=total, retain_until=now + retention, lease_until=None, claimed_by=None))
            await db.execute(update(batch_lines).where(batch_lines.c.batch_id == batch_id)
                             .values(request=None))
        return bool(done.rowcount)

    # ------------------------------------------------------------------ chunks of lines

    async def claim_chunk(self, replica: str) -> ChunkClaim | None:
        """The next chunk to run, held for ``lease`` seconds: pending, or held by a replica that stopped
        renewing; of a batch in progress whose window has not passed. The batch with the fewest chunks
        running goes first (then the oldest): a 3-line batch is not queued behind a 50,000-line one; before that,
        the owner with the fewest running (one caller's several batches do not hold another's back)."""
        now = time.time()
        claimable = or_(batch_chunks.c.state == "pending",
                        and_(batch_chunks.c.state == "running", batch_chunks.c.lease_until < now))
        held = batch_chunks.alias("held")
        running = (select(func.count()).select_from(held).where(
            held.c.batch_id == batch_chunks.c.batch_id, held.c.state == "running", held.c.lease_until >= now)
            .scalar_subquery())
        mine, theirs = batch_chunks.alias("mine"), batches.alias("theirs")
        owner_running = select(func.count()).select_from(mine.join(theirs, theirs.c.id == mine.c.batch_id)).where(
            theirs.c.owner == batches.c.owner, mine.c.state == "running", mine.c.lease_until >= now).scalar_subquery()
        query = (select(batch_chunks.c.id).join(batches, batches.c.id == batch_chunks.c.batch_id)
                 .where(claimable, batch_chunks.c.not_before <= now, batches.c.status == "in_progress",
                        batches.c.expires_at > now)
                 .order_by(owner_running, running, batches.c.created_at, batch_chunks.c.id).limit(8))
        async with self.engine.begin() as db:
            for chunk_id in (await db.scalars(query)).all():
                won = await db.execute(update(batch_chunks).where(batch_chunks.c.id == chunk_id, claimable)
                                       .values(state="running", lease_until=now + self.lease,
                                               claimed_by=replica, attempts=batch_chunks.c.attempts + 1))
                if won.rowcount:
                    return await _chunk(db, chunk_id)
        return None

    async def renew_chunk(self, chunk_id: int, replica: str) -> str | None:
        """Extend the chunk's lease; its batch's status (None: the chunk is no longer this replica's)."""
        async with self.engine.begin() as db:
            held = await db.execute(update(batch_chunks).where(
                batch_chunks.c.id == chunk_id, batch_chunks.c.claimed_by == replica,
                batch_chunks.c.state == "running").values(lease_until=time.time() + self.lease))
            if not held.rowcount:
                return None
            return await db.scalar(select(batches.c.status).join(
                batch_chunks, batch_chunks.c.batch_id == batches.c.id).where(batch_chunks.c.id == chunk_id))

    async def put_answer(self, batch_id: str, n: int, status_code: int, answer: dict,
                         tokens: tuple[int, int] = (0, 0)) -> bool:
        """Answer a line once: False when it was answered already (by another run, or closed)."""
        async with self.engine.begin() as db:
            done = await db.execute(update(batch_lines).where(
                batch_lines.c.batch_id == batch_id, batch_lines.c.n == n, batch_lines.c.status_code.is_(None))
                .values(status_code=status_code, answer=answer, request=None, prompt_tokens=tokens[0],
                        completion_tokens=tokens[1]))
        return bool(done.rowcount)

    async def finish_chunk(self, chunk_id: int, replica: str) -> None:
        async with self.engine.begin() as db:
            await db.execute(update(batch_chunks).where(batch_chunks.c.id == chunk_id,
                                                        batch_chunks.c.claimed_by == replica)
                             .values(state="done", lease_until=None))

    async def release_chunk(self, chunk_id: int, replica: str, *, not_before: float = 0.0,
                            tried: bool = True) -> None:
        """Give a chunk back, pending from ``not_before``; ``tried=False`` (a replica stopping) does not count
        the attempt."""
        attempts = batch_chunks.c.attempts if tried else batch_chunks.c.attempts - 1
        async with self.engine.begin() as db:
            await db.execute(update(batch_chunks).where(
                batch_chunks.c.id == chunk_id, batch_chunks.c.claimed_by == replica,
                batch_chunks.c.state == "running").values(state="pending", lease_until=None,
                                                          not_before=not_before, attempts=attempts))

    async def counts(self) -> dict[str, int]:
        async with self.engine.connect() as db:
            return dict((await db.execute(select(batches.c.status, func.count()).group_by(batches.c.status))).all())


async def _chunk(db, chunk_id: int) -> ChunkClaim:
    row = (await db.execute(select(batch_chunks, batches.c.endpoint).join(
        batches, batches.c.id == batch_chunks.c.batch_id).where(batch_chunks.c.id == chunk_id))
        ).mappings().one()
    lines = (await db.execute(select(batch_lines.c.n, batch_lines.c.custom_id, batch_lines.c.request).where(
        batch_lines.c.batch_id == row["batch_id"], batch_lines.c.n.between(row["first"], row["last"]),
        batch_lines.c.status_code.is_(None)).order_by(batch_lines.c.n))).all()
    return ChunkClaim(row["id"], row["batch_id"], row["endpoint"], row["attempts"],
                      tuple(OpenLine(n, custom_id, bytes(request)) for n, custom_id, request in lines
                            if request is not None))
