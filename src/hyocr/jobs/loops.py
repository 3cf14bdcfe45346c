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


def next_wait(wait: float, poll: float, worked: bool) -> float:
    """The wait before the next pass: ``poll`` after a pass that found work, else the last wait doubled, up to
    ``poll * IDLE_FACTOR``."""
    return poll if worked else min(wait * 2, poll * IDLE_FACTOR)


async def passes(one_pass: Callable[[], Awaitable[bool]], wake: asyncio.Event, poll: float, what: str) -> None:
    """``one_pass()`` until cancelled: again as soon as ``wake`` is set, else after a wait of ``poll`` seconds
    that grows while passes find nothing (``one_pass`` returns whether it did work; see IDLE_FACTOR). A pass
    that fails (the database away for a moment) is logged and tried again after ``poll``."""
    wait = poll
    while True:
        wake.clear()  # before the pass: a wake set during it runs the next pass at once
        try:
            worked = bool(await one_pass())
        except Exception:
            log.exception("%s failed", what)
            worked = True
        wait = next_wait(wait, poll, worked)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await wake.wait()
                wait = poll
