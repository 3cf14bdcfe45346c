"""The one shape of the jobs layer's background loops (ranges, whole batches, outputs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("hyocr.jobs")


async def passes(one_pass: Callable[[], Awaitable[None]], wake: asyncio.Event, poll: float, what: str) -> None:
    """``one_pass()`` until cancelled: again as soon as ``wake`` is set, else every ``poll`` seconds. A pass
    that fails (the database away for a moment) is logged and tried at the next one."""
    while True:
        try:
            await one_pass()
        except Exception:
            log.exception("%s failed", what)
        wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll):
                await wake.wait()
