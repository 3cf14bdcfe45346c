"""PrioritySlots: an engine's workers handed out by priority, for engines that queue work themselves.

A thread pool queues first come, first served: a job's pages handed to it ahead of an online request make
that request wait for all of them. Taking a slot here before submitting keeps the pool's queue empty, and
a freed slot goes to the waiter of the lowest ``EngineRequest.priority`` (then the earliest), so an online
request waits at most for the pages already being read.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator


class PrioritySlots:
    def __init__(self, slots: int) -> None:
        self.free = slots
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        if self.free and not self._waiters:
            self.free -= 1
        else:
            waiter = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, (priority, next(self._order), waiter))
            try:
                await waiter  # resolved by a release, which hands over its slot
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # handed over just as we left: pass it on
                else:
                    waiter.cancel()  # left in the heap, skipped when reached
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
