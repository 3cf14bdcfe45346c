"""Admission control: at most ``max_concurrency`` requests in the engine, at most ``max_queue``
waiting, each for at most ``max_wait`` seconds; the rest are refused (503 + Retry-After) before their
images are decoded, so an overload costs the server almost nothing and accepted requests keep their
latency. Without the wait bound a queue longer than the engine drains in minutes held its requests for
as long, past any client's patience (the request deadline starts once a request is admitted)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from ..errors import ServiceUnavailable
from ..observability.logs import record


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int, max_wait: float | None = None) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.max_wait = max_wait
        self.in_flight = 0
        self._waiters: deque[asyncio.Future] = deque()
        # Called after every change of in_flight or waiting: with several API processes each one writes its
        # share of the gauges then, so a scrape of any process sums exact values (observability/metrics.py).
        self.on_change: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> Ticket:
        if self.in_flight < self.max_concurrency and not self._waiters:
            self.in_flight += 1
            self._changed()
            return Ticket(self)
        if len(self._waiters) >= self.max_queue:
            record(rejected="overloaded")
            raise ServiceUnavailable(
                "the server is at capacity; retry shortly", code="overloaded", headers={"Retry-After": "1"}
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._changed()
        try:
            async with asyncio.timeout(self.max_wait):
                await waiter  # resolved by release(), which hands over its slot
        except TimeoutError:
            self._give_up(waiter)
            record(rejected="queue_timeout")
            raise ServiceUnavailable(
                f"no engine slot came free within {self.max_wait:g} s; retry shortly", code="queue_timeout",
                headers={"Retry-After": "1"},
            ) from None
        except BaseException:
            self._give_up(waiter)
            raise
        return Ticket(self)

    def _give_up(self, waiter: asyncio.Future) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._changed()
        elif waiter.done() and not waiter.cancelled():
            self._release_slot()  # the slot was handed over just as we gave up: pass it on

    def _release_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to the next waiter; in_flight unchanged
                self._changed()
                return
        self.in_flight -= 1
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


class Ticket:
    """One admitted request's slot. ``release`` is idempotent (streams end in several ways)."""

    __slots__ = ("_admission", "_released")

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release_slot()

    def __del__(self) -> None:
        # Safety net: a stream that was admitted but never iterated (client gone before the first
        # byte) still gives its slot back when it is collected.
        self.release()

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
