"""The engine side of ``API_PROCESSES=N``: an API process's vLLM client of the one engine core it shares.

The parent (server/processes.py) starts vLLM's engine core and N API processes; in each, ``VllmEngine``
connects to the core through a ``SharedEngineCore``: the ZMQ addresses vLLM's launcher gave the process,
the core's process ids (watched: a client of a core it did not start would otherwise wait forever when
the core dies) and a counter of the processes whose first calls were answered (the parent reads it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import select
import threading
import time
from typing import Any

from ...errors import ServiceUnavailable
from . import compat

log = logging.getLogger(__name__)
# An API process whose first calls (self test, warm-up) get no answer in this many seconds exits, and the
# parent starts the engine core and all the API processes again (server/processes.py, START_ATTEMPTS): the
# guard against a core that stays silent at start. A test hook (README: "Test and benchmark hooks").
FIRST_REPLY_TIMEOUT = float(os.environ.get("HYOCR_FIRST_REPLY_TIMEOUT", "60"))


@dataclasses.dataclass
class SharedEngineCore:
    """The engine core an API process connects to: the ZMQ addresses vLLM's launcher gave it."""

    client_config: dict[str, Any]
    engine_pids: tuple[int, ...] = ()  # the engine core processes (the parent's children, not ours)
    ready_count: Any = None  # a shared counter of the API processes whose engine answered (the parent reads it)
    connected: bool = False
    engine: Any = dataclasses.field(default=None, repr=False)  # the AsyncLLM client, once connected

    @property
    def index(self) -> int:
        return int(self.client_config.get("client_index", 0))

    @property
    def count(self) -> int:
        return int(self.client_config.get("client_count", 1))

    @property
    def all_up(self) -> bool:
        """Every API process's first calls were answered (the parent counts them)."""
        return self.ready_count is None or self.ready_count.value >= self.count

    def connect(self, engine_kwargs: dict[str, Any]) -> Any:
        """An ``AsyncLLM`` client of the shared core (blocking: it waits for the core's handshake)."""
        if self.connected:  # the core it knew is gone; only the parent can start another
            raise ServiceUnavailable("the shared vLLM engine core failed; the server restarts as a whole",
                                     code="engine_dead")
        self.connected = True
        config = engine_config(engine_kwargs, self.count, self.index)
        addresses = {k: v for k, v in self.client_config.items() if k not in ("client_index", "client_count")}
        engine = compat.connect_async_llm(config, addresses, self.count, self.index,
                                          disable_log_stats=bool(engine_kwargs.get("disable_log_stats")))
        self.watch(engine)
        self.engine = engine
        return engine

    def client_state(self) -> dict[str, Any]:
        """What this process's vLLM client holds (for the log, when the core does not answer)."""
        return compat.client_state(self.engine)

    async def first_reply(self, calls: Any) -> None:
        """The first calls to the engine core (self test, warm-up), bounded by FIRST_REPLY_TIMEOUT; then
        this API process counts as up for the parent."""
        try:
            async with asyncio.timeout(FIRST_REPLY_TIMEOUT):
                await calls
        except TimeoutError:
            log.error("no answer from the shared engine core: %s", self.client_state())
            raise RuntimeError(f"the shared vLLM engine core did not answer in {FIRST_REPLY_TIMEOUT:g}s") from None
        if self.ready_count is not None:
            with self.ready_count.get_lock():
                self.ready_count.value += 1

    def watch(self, engine: Any) -> None:
        """Mark ``engine`` dead when a core process exits, as vLLM's client does for the processes it
        started itself. A client of a shared core started none, so without this it would wait for
        outputs forever: with it, every waiting request fails at once (EngineDeadError: a JSON 503),
        readiness goes false, and the supervisor ends this process."""
        if not self.engine_pids:
            return

        def monitor() -> None:
            wait_for_any_exit(self.engine_pids)
            if compat.mark_core_dead(engine):
                log.error("the shared vLLM engine core exited")

        threading.Thread(target=monitor, daemon=True, name="hyocr-engine-core-monitor").start()


def engine_config(kwargs: dict[str, Any], count: int, rank: int) -> Any:
    """vLLM's config for ``count`` API processes, as seen from process ``rank`` (-1: the parent)."""
    return compat.api_process_engine_config(kwargs, count, rank)


def wait_for_any_exit(pids: tuple[int, ...]) -> None:
    """Block until one of ``pids`` (not children of this process) has exited: pidfds where the kernel
    has them (Linux 5.3+), else a poll four times a second."""
    try:
        fds = [os.pidfd_open(pid) for pid in pids]
    except (AttributeError, OSError):  # no pidfd support, or a process already gone
        while all(alive(pid) for pid in pids):
            time.sleep(0.25)
        return
    try:
        select.select(fds, [], [])  # a pidfd turns readable when its process exits
    finally:
        for fd in fds:
            os.close(fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    return True
