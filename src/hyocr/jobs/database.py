"""The jobs database's connection: where it is, its file's mode, SQLite's pragmas, its tables created once.

SQLite (WAL, the default, under DATA_DIR) or PostgreSQL; store.py reads and writes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from pathlib import Path
from typing import NoReturn

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from .schema import metadata, upgrade

log = logging.getLogger(__name__)
# Several API processes (or replicas) open one database at the same moment: the loser of the race to create a
# table sees "already exists" (SQLite, PostgreSQL) or a duplicate catalog row (PostgreSQL), and tries again,
# when the winner's tables are there to be seen.
SCHEMA_ATTEMPTS = 8
# What another process creating the same tables at the same moment looks like. SQLite's "database is locked"
# comes without waiting out busy_timeout where a read turned write loses to another writer (the busy handler
# is skipped there to avoid a deadlock); creating the tables is idempotent, so it is tried again too.
_RACED = ("already exists", "duplicate", "database is locked")


def database_url(settings) -> str:
    if settings.jobs_database_url:
        return settings.jobs_database_url
    return f"sqlite+aiosqlite:///{settings.data_path / 'jobs.db'}"


def private_sqlite(path: Path) -> None:
    """The database holds every caller's documents, results and callback headers (receivers' credentials):
    readable by the server's user only. A new folder is 0700; the file is made 0600 before SQLite opens it,
    which gives its -wal and -shm files the same mode (an older database's are narrowed here)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(OSError):  # another user's file, or none
            if part.stat().st_mode & 0o077:
                part.chmod(0o600)


async def create_schema(engine: AsyncEngine, url: str) -> None:
    """Create the tables if missing (several processes may race to); an unopenable database raises one line."""
    if url.startswith("sqlite"):
        path = url.split(":///", 1)[1].split("?", 1)[0]  # the file, without the URL's query
        if path and path != ":memory:":
            private_sqlite(Path(path))
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        try:
            async with engine.begin() as db:
                await db.run_sync(metadata.create_all)
                await db.run_sync(upgrade)
            return
        except SQLAlchemyError as exc:
            cause = str(getattr(exc, "orig", exc))  # the driver's message, not the statement
            if attempt < SCHEMA_ATTEMPTS and any(word in cause.lower() for word in _RACED):
                log.info("jobs database: another process created the same tables (%s); again",
                         cause.splitlines()[0][:120] if cause else "")
                await asyncio.sleep(0.1 * attempt * (1 + random.random()))  # another process is creating the tables
                continue
            _unopenable(engine, exc)
        except OSError as exc:
            _unopenable(engine, exc)


def _unopenable(engine: AsyncEngine, exc: BaseException) -> NoReturn:
    where = engine.url.render_as_string(hide_password=True)
    raise RuntimeError(f"the jobs database {where} cannot be opened: {type(exc).__name__}: {exc}") from None


def sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint; WAL keeps it consistent
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
