"""Several copies of one engine serving side by side in this process: ENGINES_PER_GPU vLLM engine cores on
a GPU (each its own process, scheduler thread and KV cache), behind one engine interface, so the service
keeps one admission and one /metrics, and each copy is a replica in /ready, /v1/models and
``hyocr_engine_replicas``.

- A request goes to the live copy with the least outstanding work: the tokens it still owes, a request's
  prefill (its images' visual tokens) until its first output and its expected output less what it has
  written. Request counts would weigh a 4-megapixel page like a card.
- Copies start one after another: vLLM checks the GPU's free memory at start, and each copy's share was
  sized for a GPU holding the ones before it (engines/vllm/tuning.py).
- A copy that dies is restarted alone while the others serve. Its requests fail with a retryable 503, or,
  before any output, are sent to another copy. The pool is ready while one copy is; the supervisor only
  reports it (``self_healing``), the pool's own monitor restarts what died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from ..errors import ServiceUnavailable
from ..types import EngineChunk, EngineRequest
from .base import Engine, EngineInfo, Replica

log = logging.getLogger("hyocr.engines")
# Errors of a copy that mean "this copy cannot serve now": before any output the request goes to another.
RETRYABLE = frozenset({"engine_dead", "engine_restarting", "engine_not_ready"})
OUTPUT_ESTIMATE = 1024  # output tokens expected of a request without max_tokens (a document page's)


@dataclass(frozen=True, slots=True)
class Work:
    """What a request will cost a copy, in tokens: its prefill and its expected output."""

    prefill: float
    output: float


def output_budget(request: EngineRequest) -> int:
    """The output tokens a request is expected to write: its budget, up to OUTPUT_ESTIMATE."""
    return min(request.sampling.max_tokens or OUTPUT_ESTIMATE, OUTPUT_ESTIMATE)


def default_cost(request: EngineRequest) -> Work:
    """An engine-neutral estimate: a token per 1024 pixels (HunyuanOCR's is ~1 per 1000), and the output."""
    pixels = sum(p.image.width * p.image.height for p in request.images if p.image is not None)
    return Work(pixels / 1024, output_budget(request))


class _Copy:
    """One copy and what the pool knows of it."""

    def __init__(self, engine: Engine, index: int) -> None:
        self.engine = engine
        self.index = index
        self.state = "down"  # up | down | restarting
        self.outstanding = 0.0  # tokens of work owed to the requests it holds
        self.requests = 0
        self.served = 0
        self.restarts = 0
        self.last_error = ""


class _Ticket:
    """A request's claim on a copy's outstanding work, shrinking as the request writes."""

    def __init__(self, copy: _Copy, work: Work) -> None:
        self.copy, self.work = copy, work
        self.owed = work.prefill + work.output
        copy.outstanding += self.owed
        copy.requests += 1

    def progress(self, completion_tokens: int) -> None:
        owed = max(0.0, self.work.output - completion_tokens)  # the prefill is done once output comes
        self.copy.outstanding -= self.owed - owed
        self.owed = owed

    def close(self) -> None:
        self.copy.outstanding -= self.owed
        self.copy.requests -= 1
        self.owed = 0.0


class EnginePool(Engine):
    self_healing = True

    def __init__(self, copies: list[Engine], *, cost: Callable[[EngineRequest], Work] = default_cost,
                 kind: str = "copy", monitor_interval: float = 1.0, max_backoff: float = 60.0) -> None:
        if not copies:
            raise ValueError("an engine pool needs at least one copy")
        self.copies = [_Copy(engine, i) for i, engine in enumerate(copies)]
        self.cost = cost
        self.kind = kind  # what /v1/models calls a copy ("engine core" for vLLM)
        self.monitor_interval = monitor_interval
        self.max_backoff = max_backoff
        self._where: dict[str, _Copy] = {}
        self._monitor: asyncio.Task | None = None

    @property
    def info(self) -> EngineInfo:
        """The first copy's (the copies are alike), with their count. A capability a copy turned off at its
        start (structured outputs) is off for the pool: a request may go to any copy."""
        first = self.copies[0].engine.info
        off = next((c.engine.info for c in self.copies if not c.engine.info.structured), None)
        structured = {"structured": False, "structured_off": off.structured_off} if off is not None else {}
        return replace(first, details={**first.details, "copies": f"{len(self.copies)} x {self.kind}"},
                       **structured)

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Start every copy, one after another (each one's memory check sees the ones before it)."""
        for copy in self.copies:
            await self._start(copy)
        self._monitor = asyncio.get_running_loop().create_task(self._watch(), name="engine-pool-monitor")

    async def _start(self, copy: _Copy) -> None:
        await copy.engine.start()
        copy.state, copy.last_error = "up", ""

    async def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        for copy in self.copies:
            with contextlib.suppress(Exception):
                await copy.engine.stop()
            copy.state = "down"

    async def ready(self) -> bool:
        """Ready while one copy is up: the others are being restarted by the pool."""
        for copy in self.copies:
            if copy.state == "up" and await copy.engine.ready():
                return True
        return False

    async def _watch(self) -> None:
        """Probe each copy that is up; one that stopped being ready is restarted alone, in a task of its own
        (a vLLM core takes a minute to start: the others stay watched meanwhile)."""
        restarting: dict[int, asyncio.Task] = {}
        try:
            while True:
                await asyncio.sleep(self.monitor_interval)
                for copy in self.copies:
                    if copy.state != "up" or copy.index in restarting:
                        continue
                    try:
                        healthy = await asyncio.wait_for(copy.engine.ready(), 10)
                    except Exception:  # a probe that raises or hangs is a failed probe
                        healthy = False
                    if not healthy:
                        copy.state = "down"
                        log.error("%s %d is down (%d requests in flight): restarting it alone", self.kind,
                                  copy.index, copy.requests)
                        task = asyncio.get_running_loop().create_task(self._restart(copy))
                        restarting[copy.index] = task
                        task.add_done_callback(lambda _t, i=copy.index: restarting.pop(i, None))
        finally:
            for task in list(restarting.values()):
                task.cancel()

    async def _restart(self, copy: _Copy) -> None:
        """Stop and start ``copy`` until it is up again, waiting longer after each failed start."""
        backoff = 1.0
        while True:
            copy.state = "restarting"
            with contextlib.suppress(Exception):
                await copy.engine.stop()
            try:
                await self._start(copy)
            except Exception as exc:
                copy.state, copy.last_error = "down", type(exc).__name__
                log.exception("%s %d did not start again; next try in %gs", self.kind, copy.index, backoff)
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, self.max_backoff)
                continue
            copy.restarts += 1
            log.warning("%s %d restarted (restart #%d)", self.kind, copy.index, copy.restarts)
            return

    # ------------------------------------------------------------------ requests

    def _pick(self, tried: set[int]) -> _Copy:
        live = [c for c in self.copies if c.state == "up" and c.index not in tried]
        if not live:
            raise ServiceUnavailable(f"no {self.kind} is up (restarting)", code="engine_restarting")
        return min(live, key=lambda c: (c.outstanding, c.requests, c.index))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        work = self.cost(request)
        tried: set[int] = set()
        while True:
            copy = self._pick(tried)
            ticket = _Ticket(copy, work)
            self._where[request.request_id] = copy
            wrote = False
            try:
                stream = copy.engine.generate(request)
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        wrote = True
                        ticket.progress(chunk.completion_tokens)
                        yield chunk
                copy.served += 1
                return
            except ServiceUnavailable as exc:
                tried.add(copy.index)
                if wrote or exc.code not in RETRYABLE or len(tried) == len(self.copies):
                    raise
                log.warning("%s %d could not take request %s (%s): sent to another", self.kind, copy.index,
                            request.request_id, exc.code)
            finally:
                ticket.close()
                self._where.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        copy = self._where.get(request_id)
        if copy is not None:
            await copy.engine.abort(request_id)

    def expected_seconds(self, request: EngineRequest) -> float | None:
        return self.copies[0].engine.expected_seconds(request)

    def replicas(self) -> list[Replica]:
        out = []
        for copy in self.copies:
            details: dict[str, object] = {"state": copy.state, "requests": copy.requests,
                                          "outstanding_tokens": round(copy.outstanding), "served": copy.served,
                                          "restarts": copy.restarts}
            details.update(getattr(copy.engine, "placement", dict)())  # pid, GPU: what the copy knows of itself
            if copy.last_error:
                details["last_error"] = copy.last_error
            out.append(Replica(str(copy.index), copy.state == "up", details))
        return out
