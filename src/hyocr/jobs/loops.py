"""The one shape of the jobs layer's background loops (ranges, whole batches, outputs, webhooks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("hyocr.jobs")

# An idle loop's wait doubles from ``poll`` up to this many times it: each pass is a database query, and four
# loops at 0.5 s kept an idle server at ~6% of a CPU (and every replica querying a shared database 8 times a
# second). Work found, or a wake, brings the wait back to ``poll``; other replicas' work is seen within 2 s.
IDLE_FACTOR = 4


class Idle:
    """The wait before the next pass: ``poll`` while passes find work, doubling to ``poll * IDLE_FACTOR``."""

    def __init__(self, poll: float) -> None:
        self.poll, self.wait = poll, poll

    def after(self, worked: bool) -> float:
        self.wait = self.poll if worked else min(self.wait * 2, self.poll * IDLE_FACTOR)
        return self.wait

    def woken(self) -> None:
        self.wait = self.poll


async def passes(one_pass: Callable[[], Awaitable[bool]], wake: asyncio.Event, poll: float, what: str) -> None:
    """``one_pass()`` until cancelled: again as soon as ``wake`` is set, else after a wait of ``poll`` seconds
    that grows while passes find nothing (``one_pass`` returns whether it did work; see IDLE_FACTOR). A pass
    that fails (the database away for a moment) is logged and tried again after ``poll``."""
    idle = Idle(poll)
    while True:
        wake.clear()  # before the pass: a wake set during it runs the next pass at once
        try:
            worked = bool(await one_pass())
        except Exception:
            log.exception("%s failed", what)
            worked = True
        wait = idle.after(worked)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await wake.wait()
                idle.woken()
