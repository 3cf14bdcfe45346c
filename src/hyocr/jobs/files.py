"""Files of the OpenAI Batch API (/v1/files): batch input files a caller uploads, and the output and error
files a batch writes. Kept in the jobs database (under DATA_DIR with SQLite; shared by the replicas of one
PostgreSQL database) in parts of ``PART`` bytes, so a 200 MiB file is written and downloaded a part at a
time, never held whole.

A file belongs to its caller (another gets 404), counts against JOB_MAX_STORED_BYTES (a caller's files on
their own, apart from its jobs' documents), and expires like a job's results (JOB_RETENTION after it was
made, or the ``expires_after`` the upload asked for). A file is
visible only once all its parts are stored: an upload cut by a crash leaves an incomplete row the sweep
removes. A deleted file is gone at once for every route, but its parts stay for ``DELETE_GRACE`` seconds: a
download or a batch's validation that began before the delete reads the whole file, never a shorter one.
"""

from __future__ import annotations

import asyncio
import codecs
import re
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ..errors import InvalidRequest, NotFound, PayloadTooLarge, RateLimited
from . import paging
from .schema import file_parts, files

if TYPE_CHECKING:
    from .batch_store import BatchStore

PART = 4 * 1024 * 1024
PURPOSES = ("batch",)  # what a caller may upload; a batch's own files are "batch_output"
ABANDONED = 3600.0  # seconds after which an upload that never completed is swept
DELETE_GRACE = 600.0  # seconds a deleted file's parts outlive it, for the reads that began before the delete
DELETED = 2  # ``complete`` of a deleted file: hidden, swept after DELETE_GRACE
# What this server's file ids look like: anything else is no file of ours, answered before the database sees
# it (a NUL in an id would be a PostgreSQL error, not a 404).
FILE_ID = re.compile(r"file-[0-9a-f]{32}")


async def utf8_only(parts: AsyncIterator[bytes], *, param: str) -> AsyncIterator[bytes]:
    """``parts`` of a JSONL file, refused (400 ``invalid_encoding``) where they are not UTF-8 text: UTF-16 or
    UTF-32 (PowerShell's default encoding, with a byte order mark; read as UTF-8, its lines were mangled into
    invalid lines and a phantom one), bytes that are not UTF-8 (an image, a gzip uploaded by mistake was stored
    and run as a batch of "invalid JSON" lines), or a NUL anywhere (no JSON text holds one). Checked as the parts
    pass, so the file is never held whole."""
    decoder, at = codecs.getincrementaldecoder("utf-8")("strict"), 0

    def refuse(what: str) -> InvalidRequest:
        return InvalidRequest(f"the file is not UTF-8 text ({what}); JSONL is UTF-8: save it as UTF-8",
                              param=param, code="invalid_encoding")

    async for data in parts:
        if at == 0 and data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise refuse("it starts with a UTF-16/32 byte order mark")
        try:
            decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise refuse(f"near byte {at + exc.start}, not UTF-8") from None
        if (nul := data.find(0)) != -1:
            raise refuse(f"byte {at + nul} is a NUL")
        at += len(data)
        yield data
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise refuse("it ends inside a character") from None


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    lines: int | None
    created_at: float
    expires_at: float | None


class LineCounter:
    """Counts the non-blank lines of bytes fed in pieces (a line cut between two pieces counts once)."""

    def __init__(self) -> None:
        self.lines = 0
        self._open = False  # the line being read has something besides whitespace
        self._first = True  # it is the file's first: a UTF-8 byte order mark there is no content

    def feed(self, data: bytes) -> None:
        parts = data.split(b"\n")
        for i, part in enumerate(parts):
            if self._first:  # (bytes of the mark alone are the mark, or not UTF-8, which is refused)
                part = part.lstrip(b"\xef\xbb\xbf")
            self._open = self._open or bool(part.strip())
            if i < len(parts) - 1:
                self.lines += self._open
                self._open = self._first = False

    def close(self) -> int:
        self.lines += self._open
        self._open = False
        return self.lines


class FileStore:
    def __init__(self, engine: AsyncEngine, settings) -> None:
        self.engine = engine
        self.settings = settings

    # ------------------------------------------------------------------ writing

    async def write(self, *, owner: str, filename: str, purpose: str, parts: AsyncIterator[bytes],
                    expires_at: float | None, file_id: str | None = None, count_lines: bool = False,
                    max_bytes: int | None = None) -> FileRecord:
        """Store a file from ``parts`` (any sizes; stored in PART-sized rows) and make it visible at the end.
        A given ``file_id`` replaces the file of that id (a batch's output written again after a crash)."""
        file_id = file_id or f"file-{uuid.uuid4().hex}"
        now = time.time()
        async with self.engine.begin() as db:
            await db.execute(delete(file_parts).where(file_parts.c.file_id == file_id))
            await db.execute(delete(files).where(files.c.id == file_id))
            await db.execute(insert(files).values(id=file_id, owner=owner, filename=filename, purpose=purpose,
                                                  bytes=0, created_at=now, expires_at=expires_at, complete=0))
        counter = LineCounter() if count_lines else None
        size, n, buffer = 0, 0, bytearray()
        try:
            async for data in parts:
                size += len(data)
                if max_bytes is not None and size > max_bytes:
                    raise PayloadTooLarge(f"the file is larger than the {max_bytes} byte limit", param="file")
                if counter is not None:
                    counter.feed(data)
                buffer += data
                while len(buffer) >= PART:
                    await self._part(file_id, n, bytes(buffer[:PART]))
                    del buffer[:PART]
                    n += 1
            if buffer or n == 0:
                await self._part(file_id, n, bytes(buffer))
            async with self.engine.begin() as db:
                await db.execute(update(files).where(files.c.id == file_id).values(
                    bytes=size, complete=1, lines=counter.close() if counter is not None else None))
        except BaseException:
            await self.drop(file_id)
            raise
        return FileRecord(file_id, owner, filename, purpose, size, counter.lines if counter else None, now,
                          expires_at)

    async def _part(self, file_id: str, n: int, data: bytes) -> None:
        async with self.engine.begin() as db:
            await db.execute(insert(file_parts).values(file_id=file_id, n=n, data=data))

    async def drop(self, file_id: str) -> None:
        async with self.engine.begin() as db:
            await db.execute(delete(file_parts).where(file_parts.c.file_id == file_id))
            await db.execute(delete(files).where(files.c.id == file_id))

    # ------------------------------------------------------------------ reading

    async def get(self, owner: str | None, file_id: str) -> FileRecord | None:
        if not FILE_ID.fullmatch(file_id):
            return None
        where = and_(files.c.id == file_id, files.c.complete == 1)
        if owner is not None:
            where = and_(where, files.c.owner == owner)
        async with self.engine.connect() as db:
            row = (await db.execute(select(files).where(where))).mappings().first()
        return _record(row) if row else None

    async def parts(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, a part at a time (each part its own short query); NotFound if a part is gone
        before its size is read (swept under a read that outlasted DELETE_GRACE): never a shorter file."""
        async with self.engine.connect() as db:
            size = await db.scalar(select(files.c.bytes).where(files.c.id == file_id))
        n = read = 0
        while size is not None and read < size:
            async with self.engine.connect() as db:
                data = await db.scalar(select(file_parts.c.data).where(file_parts.c.file_id == file_id,
                                                                       file_parts.c.n == n))
            if data is None:
                break
            read += len(data)
            yield bytes(data)
            n += 1
        if size is None or read < size:
            raise NotFound(f"file {file_id} was deleted while it was read", param="input_file_id",
                           code="file_not_found")

    async def list(self, owner: str, *, limit: int, after: str | None, order: str, purpose: str | None
                   ) -> tuple[list[FileRecord], bool]:
        where = and_(files.c.owner == owner, files.c.complete == 1)
        if purpose is not None:
            where = and_(where, files.c.purpose == purpose)
        newest_first = order == "desc"
        if after is not None and not FILE_ID.fullmatch(after):
            return [], False
        if after is not None:
            if (past := await paging.after(self.engine, files, owner, after, newest_first=newest_first)) is None:
                return [], False
            where = and_(where, past)
        keys = (files.c.created_at.desc(), files.c.id.desc()) if newest_first else (files.c.created_at,
                                                                                    files.c.id)
        async with self.engine.connect() as db:
            rows = (await db.execute(select(files).where(where).order_by(*keys).limit(limit + 1))
                    ).mappings().all()
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    async def stored(self, owner: str) -> int:
        """The bytes ``owner``'s files hold on disk: a deleted file's too, until its parts are swept (an upload
        and delete loop filled the disk past the quota)."""
        async with self.engine.connect() as db:
            return int(await db.scalar(select(func.coalesce(func.sum(files.c.bytes), 0)).where(
                files.c.owner == owner)) or 0)

    # ------------------------------------------------------------------ deleting

    async def delete(self, owner: str, file_id: str) -> bool:
        if not FILE_ID.fullmatch(file_id):
            return False
        async with self.engine.begin() as db:
            found = await db.execute(update(files).where(files.c.id == file_id, files.c.owner == owner,
                                                         files.c.complete == 1)
                                     .values(complete=DELETED, expires_at=time.time() + DELETE_GRACE))
        return found.rowcount == 1

    async def sweep(self, now: float) -> int:
        """Delete files past their expiry, and uploads a crash left incomplete."""
        async with self.engine.connect() as db:
            gone = (await db.scalars(select(files.c.id).where(or_(
                files.c.expires_at < now, and_(files.c.complete == 0, files.c.created_at < now - ABANDONED)))
                .limit(200))).all()
        for file_id in gone:
            await self.drop(file_id)
        return len(gone)


async def held_bytes(owner: str, files: FileStore, batches: BatchStore | None) -> int:
    """What counts toward JOB_MAX_STORED_BYTES for a caller: its files, and the requests its running batches copied
    from their inputs (batches.py)."""
    copied = (await batches.held_bytes(owner))[0] if batches is not None else 0
    return await files.stored(owner) + copied


class Files:
    """What the /v1/files routes call: uploads checked against the caps, reads and deletes by owner."""

    def __init__(self, store: FileStore, settings, batches: BatchStore | None = None) -> None:
        self.store = store
        self.settings = settings
        self.batches = batches
        self._uploading: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def _held(self, owner: str) -> int:
        return await held_bytes(owner, self.store, self.batches)

    async def upload(self, owner: str, *, filename: str, purpose: str, size: int, parts: AsyncIterator[bytes],
                     expires_after: int | None) -> FileRecord:
        if purpose not in PURPOSES:
            raise InvalidRequest(f"purpose {purpose[:64]!r} is not supported: this server takes files for "
                                 f"{', '.join(PURPOSES)}", param="purpose", code="invalid_purpose")
        cap = self.settings.file_max_bytes  # the body cap of /v1/files is its own (api/app.py: FILE_MAX_BYTES)
        if size > cap:
            raise PayloadTooLarge(f"the file ({size} bytes) is larger than the {cap} byte limit",
                                  param="file")
        # One caller's uploads one at a time in this process: each checks the quota with the one before it
        # stored. Checked in flight together, ten of them had held 3.6x the quota; checked again afterwards
        # against each other, eight at once could all be refused.
        async with self._uploading.setdefault(owner, asyncio.Lock()):
            stored, room = await self._held(owner), self.settings.job_max_stored_bytes
            if stored + size > room:
                raise self._over(stored, size, room)
            now = time.time()
            keep = expires_after if expires_after is not None else self.settings.job_retention
            filename = "".join(c for c in filename if c.isprintable())[:512]  # no NUL or line breaks to store
            record = await self.store.write(owner=owner, filename=filename or "upload.jsonl", purpose=purpose,
                                            parts=utf8_only(parts, param="file"), expires_at=now + keep,
                                            count_lines=True, max_bytes=cap)
            # Counted again with this file in, for uploads other API processes stored meanwhile: past the quota
            # now, this one goes, unseen.
            stored = await self._held(owner)
            if stored > room:
                await self.store.drop(record.id)
                raise self._over(stored - record.bytes, record.bytes, room)
        return record

    @staticmethod
    def _over(stored: int, size: int, room: int) -> RateLimited:
        return RateLimited(f"your files (and your running batches' requests) hold {stored} bytes; this one "
                           f"({size} bytes) would pass the {room} bytes "
                           f"kept per caller: delete files you no longer need (a deleted file counts for "
                           f"{DELETE_GRACE / 60:g} more minutes, while reads it had begun finish)",
                           code="too_many_file_bytes", headers={"Retry-After": "60"})

    async def get(self, owner: str, file_id: str) -> FileRecord:
        found = await self.store.get(owner, file_id)
        if found is None:  # another caller's file is not found either
            raise NotFound(f"no file {file_id[:80]!r}", param="file_id", code="file_not_found")
        return found

    async def delete(self, owner: str, file_id: str) -> None:
        if not await self.store.delete(owner, file_id):
            raise NotFound(f"no file {file_id[:80]!r}", param="file_id", code="file_not_found")

    async def list(self, owner: str, *, limit: int, after: str | None, order: str, purpose: str | None):
        return await self.store.list(owner, limit=limit, after=after, order=order, purpose=purpose)


def _record(row: Any) -> FileRecord:
    return FileRecord(row["id"], row["owner"], row["filename"], row["purpose"], int(row["bytes"]),
                      row["lines"], row["created_at"], row["expires_at"])
