"""Cursor pagination of an owner's rows (jobs, batches, files): ordered by (created_at, id), the cursor the
last id of the previous page, so a page never shifts when rows are added meanwhile."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine


async def after(engine: AsyncEngine, table: Any, owner: str, cursor: str, *, newest_first: bool = True) -> Any | None:
    """The condition for the owner's rows past the row ``cursor`` in that order; None when ``cursor`` is not
    one of the owner's rows (the page is then empty: another caller's id says nothing)."""
    async with engine.connect() as db:
        row = (await db.execute(select(table.c.created_at, table.c.id).where(
            table.c.id == cursor, table.c.owner == owner))).first()
    if row is None:
        return None
    if newest_first:
        return or_(table.c.created_at < row.created_at,
                   and_(table.c.created_at == row.created_at, table.c.id < row.id))
    return or_(table.c.created_at > row.created_at, and_(table.c.created_at == row.created_at, table.c.id > row.id))
