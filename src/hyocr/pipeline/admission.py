"""Admission control: at most ``max_concurrency`` requests in the engine, at most ``max_queue``
waiting, each for at most ``max_wait`` seconds; the rest are refused (503 + Retry-After) before their
images are decoded, so an overload costs the server almost nothing and accepted requests keep their
latency. Without the wait bound a queue longer than the engine drains in minutes held its requests for
as long, past any client's patience (the request deadline starts once a request is admitted).

Callers take turns: each identified caller (the gateway's principal: an API key, a JWT subject, an allowed
address) waits in a line of its own, and a freed slot goes to the next caller in turn, so one caller's burst
of a hundred requests delays another's single request by one slot, not by the whole burst. One caller may
hold at most three quarters of the queue's places, so a flood from one leaves room for the others. With no
auth every request is one anonymous caller's: the queue is first come, first served.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        # Waiters by caller; the dict's order is the turn order (the caller served moves to the back).
        self._lines: dict[str | None, deque[asyncio.Future]] = {}
        self._waiting = 0
        # Called after every change of in_flight or waiting: with several API processes each one writes its
        # share of the gauges then, so a scrape of any process sums exact values (observability/metrics.py).
        self.on_change: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return self._waiting

    def caller_places(self) -> int:
        """The most places one identified caller may hold in the queue: three quarters (rounded down), and always
        one fewer than all where there are two or more (a process's share of MAX_QUEUE may be 2 or 3)."""
        if self.max_queue <= 1:
            return 1
        return max(1, min(self.max_queue - 1, 3 * self.max_queue // 4))

    async def acquire(self, caller: str | None = None) -> Ticket:
        """A slot for ``caller`` (None: an anonymous request), now or after its turn in the queue."""
        if self.in_flight < self.max_concurrency and not self._waiting:
            self.in_flight += 1
            self._changed()
            return Ticket(self, asyncio.get_running_loop())
        line = self._lines.get(caller)
        if self._waiting >= self.max_queue or (
                caller is not None and line is not None and len(line) >= self.caller_places()):
            record(rejected="overloaded")
            raise ServiceUnavailable(
                "the server is at capacity; retry shortly", code="overloaded", headers={"Retry-After": "1"}
            )
        waiter = asyncio.get_running_loop().create_future()
        self._lines.setdefault(caller, deque()).append(waiter)
        self._waiting += 1
        self._changed()
        try:
            async with asyncio.timeout(self.max_wait):
                await waiter  # resolved by release(), which hands over its slot
        except TimeoutError:
            self._give_up(caller, waiter)
            record(rejected="queue_timeout")
            raise ServiceUnavailable(
                f"no engine slot came free within {self.max_wait:g} s; retry shortly", code="queue_timeout",
                headers={"Retry-After": "1"},
            ) from None
        except BaseException:
            self._give_up(caller, waiter)
            raise
        return Ticket(self, asyncio.get_running_loop())

    def _give_up(self, caller: str | None, waiter: asyncio.Future) -> None:
        line = self._lines.get(caller)
        if line is not None and waiter in line:
            line.remove(waiter)
            if not line:
                del self._lines[caller]
            self._waiting -= 1
            self._changed()
        elif waiter.done() and not waiter.cancelled():
            self._release_slot()  # the slot was handed over just as we gave up: pass it on

    def _release_slot(self) -> None:
        while self._lines:
            caller = next(iter(self._lines))
            line = self._lines.pop(caller)
            while line and line[0].done():  # gone (cancelled, timed out) before its task could leave the line
                line.popleft()
                self._waiting -= 1
            if not line:  # nobody live in this line: the next caller's turn, this one's kept
                continue
            waiter = line.popleft()
            self._waiting -= 1
            if line:
                self._lines[caller] = line  # back of the turn order
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

    __slots__ = ("_admission", "_loop", "_released")

    def __init__(self, admission: Admission, loop: asyncio.AbstractEventLoop) -> None:
        self._admission = admission
        self._loop = loop
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._admission._release_slot()

    def __del__(self) -> None:
        # Safety net: a stream that was admitted but never iterated (client gone before the first byte) still
        # gives its slot back when it is collected. Later, on the loop: a collection can run inside acquire()
        # between its look for a free slot and its place in the queue (or on another thread), where a slot freed
        # at once would wait unused behind the new waiter.
        if not self._released:
            self._released = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits on it any more
                self._loop.call_soon_threadsafe(self._admission._release_slot)

    async def __aenter__(self) -> Ticket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
