"""Engine supervision: notice an engine that died or stalled, and restart it.

A health check that only says "the process is up" is how servers end up answering 200 on /health
while every request fails. The supervisor probes the engine itself once a second (``engine.ready()``:
vLLM's own dead-engine flag, the transformers worker thread, the upstream's /models), and reads the
service's progress board (pipeline/progress.py), which judges progress per engine request:

- a request the engine went silent on (or overtook) while others flow is failed alone (503
  ``engine_stalled`` with Retry-After, its engine work aborted); the engine keeps serving;
- every request in the engine overdue, or a failed probe: readiness goes false, the in-flight requests
  fail at once with a retryable 503 (``engine_restarting``), the engine is stopped and started again,
  with backoff if that fails.
An engine that heals itself (``self_healing``: Ray Serve replaces its replicas) is only reported: not ready
while its probe fails, never restarted from here.
Start-up, idle time and the work before the engine (PDF rendering, fetches, decoding) are never counted.

An engine this process cannot restart (a ``SharedEngine`` whose ``restartable`` is False: one of several API processes sharing a
vLLM engine core that the parent owns) makes the process exit non-zero instead; the parent then stops
the whole server, so that the orchestrator starts it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from ..engines.base import Engine, SharedEngine
from .progress import restarting_error, stalled_error

log = logging.getLogger("hyocr.supervisor")


class EngineSupervisor:
    def __init__(self, engine: Engine, service, *, interval: float = 1.0, stall_timeout: float = 120.0,
                 probe_timeout: float = 10.0, max_backoff: float = 60.0) -> None:
        self.engine = engine
        self.service = service
        self.interval = interval
        self.stall_timeout = stall_timeout
        self.probe_timeout = probe_timeout
        self.max_backoff = max_backoff
        self.restarting = False
        self.restarts = 0
        self.last_failure: str | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="engine-supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def healthy(self) -> bool:
        if self.restarting:
            return False
        try:
            return bool(await asyncio.wait_for(self.engine.ready(), self.probe_timeout))
        except Exception:  # a probe that raises or hangs is a failed probe
            return False

    @staticmethod
    def exit(code: int) -> None:
        os._exit(code)  # no normal exit: a client of a dead engine core can block it

    def stalled(self) -> bool:
        """Fail the requests hung alone; True when the whole engine makes no progress."""
        board = self.service.progress
        hung, engine_stalled = board.check()
        for watch in hung:
            log.warning("engine request %s made no progress for %.0fs while others did: aborted",
                        watch.request_id, time.monotonic() - watch.since)
            board.hung += 1
            board.fail(watch, stalled_error(time.monotonic() - watch.since))
        return engine_stalled

    async def _watch(self) -> None:
        backoff = 1.0
        while True:
            await asyncio.sleep(self.interval)
            problem = None
            if self.stalled():
                problem = f"no progress on any of its requests for {self.stall_timeout:g}s"
            elif not await self.healthy():
                problem = "the engine's readiness probe failed"
            if problem is None:
                backoff = 1.0
                self.last_failure = None if self.engine.self_healing else self.last_failure
                continue
            if self.engine.self_healing:  # not ready until it heals itself; /ready says why
                if problem != self.last_failure:
                    log.warning("engine %s unhealthy (%s): waiting for it to replace what failed",
                                self.engine.info.name, problem)
                self.last_failure = problem
                continue
            if await self.restart(problem):
                backoff = 1.0
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)

    async def restart(self, reason: str) -> bool:
        """Stop (failing in-flight requests) and start the engine again. True when it came back."""
        self.restarting = True
        self.last_failure = reason
        # The requests in the engine fail now with a retryable error, rather than with whatever the
        # engine's stop does to them (an engine error, a 500) or a wait for their deadline; new ones
        # get the same until the engine is back.
        board = self.service.progress
        board.restarting = reason
        board.fail_all(lambda watch: restarting_error(reason))
        if isinstance(self.engine, SharedEngine) and not self.engine.restartable:
            log.critical("engine %s unhealthy (%s) and owned by the parent process: exiting", self.engine.info.name,
                         reason)
            # The requests it had are failing with JSON errors now; let their answers go out first.
            deadline = time.monotonic() + 5
            while self.service is not None and self.service.admission.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            logging.shutdown()
            self.exit(3)
            return False
        log.error("engine %s unhealthy (%s): restarting", self.engine.info.name, reason)
        try:
            try:
                await self.engine.stop()
            except Exception:
                log.exception("engine stop failed; starting it anyway")
            started = time.monotonic()
            await self.engine.start()
            self.restarts += 1
            log.warning("engine %s restarted in %.1fs (restart #%d)", self.engine.info.name,
                        time.monotonic() - started, self.restarts)
            return True
        except Exception:
            log.exception("engine restart failed")
            return False
        finally:
            self.restarting = False
            board.restarting = None
