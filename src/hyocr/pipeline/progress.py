"""Engine progress, judged per request: the evidence the stall watchdog acts on.

Every engine request is watched from the moment it reaches the engine until its stream ends. Time
before that (admission, PDF rendering, URL fetches, decoding), a cold start and an idle server are
never counted: there is nothing to watch then. While the service waits for the engine's next chunk,
the wait has a budget:

- ``stall_timeout`` seconds of silence for an engine that streams (tokens come in a rhythm);
- for a one-shot engine (rapidocr answers in one piece) once it has started on the request, its own
  estimate of the request's duration times ``ONE_SHOT_SLACK``, never less than ``stall_timeout``.

A wait past its budget is *overdue*. What follows (``ProgressBoard.check``):

- every watched request overdue: the engine as a whole makes no progress -> restart it (the
  supervisor), failing the in-flight requests with a retryable 503;
- only some overdue: such a request is *hung* when the engine had started on it (it went silent) or
  when a request of its priority or a lower one that reached the engine after it has started (it was
  overtaken; engines serve each priority in arrival order, online requests before a job's pages, so a
  page waiting behind online traffic is not overtaken). A hung request alone fails with a retryable 503 and its engine work is aborted;
  the others flow on. An overdue request that was not overtaken is queued inside the engine behind
  work that is progressing: it waits.

A wait belongs to the task awaiting the engine's chunk; failing a request cancels that task at the
await and turns the cancellation into the request's error (as ``asyncio.timeout`` does), so it works
whichever task iterates the stream. Time the consumer spends elsewhere (a slow client reading a
stream) is not a wait, and never counts as the engine's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..errors import HyocrError, ServiceUnavailable

ONE_SHOT_SLACK = 10.0  # a one-shot request may take this many times its engine's estimate
RETRY_AFTER = "2"


@dataclass(slots=True, eq=False)
class Watch:
    """One engine request being watched."""

    request_id: str
    entered: float  # when it reached the engine (monotonic)
    expected: float | None  # the engine's estimate in seconds (one-shot engines), None for streams
    priority: int = 0  # EngineRequest.priority: 0 online, higher served after lower
    since: float = 0.0  # when the current wait began
    budget: float = 0.0  # seconds of silence allowed for the current wait
    started: bool = False  # the engine has sent something for it (a token, or a start signal)
    waiting: bool = False  # awaiting the engine now, rather than the consumer
    failure: HyocrError | None = None
    task: asyncio.Task | None = field(default=None, repr=False)  # the task awaiting the engine
    cancelling: int = 0  # that task's cancellation count when the wait began


class ProgressBoard:
    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.watches: set[Watch] = set()
        self.hung = 0  # requests failed alone
        self.restarting: str | None = None  # why the engine is being restarted: new requests wait outside
        # per priority: the latest ``entered`` among requests of that priority the engine has started
        self._latest_start: dict[int, float] = {}

    # ------------------------------------------------------------------ the request's side

    def enter(self, request_id: str, expected: float | None = None, priority: int = 0) -> Watch:
        if self.restarting is not None:
            raise restarting_error(self.restarting)
        watch = Watch(request_id, time.monotonic(), expected, priority)
        self.watches.add(watch)
        return watch

    def leave(self, watch: Watch) -> None:
        self.watches.discard(watch)
        watch.waiting, watch.task = False, None

    def wait(self, watch: Watch) -> None:
        """The service is about to await the engine's next chunk for ``watch``."""
        if watch.failure is not None:
            raise watch.failure
        watch.since = time.monotonic()
        watch.budget = self._budget(watch)
        watch.waiting, watch.task = True, asyncio.current_task()
        watch.cancelling = watch.task.cancelling() if watch.task is not None else 0

    def got(self, watch: Watch) -> None:
        """A chunk arrived (the wait is over)."""
        watch.waiting = False
        if not watch.started:
            watch.started = True
            latest = self._latest_start.get(watch.priority, float("-inf"))
            self._latest_start[watch.priority] = max(latest, watch.entered)

    def failure_for(self, watch: Watch) -> HyocrError | None:
        """Inside ``except CancelledError`` around a wait: the request's error when the cancellation was
        this board's (the cancellation is then consumed), None when it came from elsewhere."""
        if watch.failure is None:
            return None
        task = asyncio.current_task()
        if task is not None and task.uncancel() > watch.cancelling:
            return None  # cancelled by someone else too (client gone, deadline): that wins
        return watch.failure

    # ------------------------------------------------------------------ the watchdog's side

    def _budget(self, watch: Watch) -> float:
        if watch.started and watch.expected is not None:
            return max(self.stall_timeout, ONE_SHOT_SLACK * watch.expected)
        return self.stall_timeout

    def overdue(self, watch: Watch, now: float) -> bool:
        return watch.waiting and now - watch.since > watch.budget

    def check(self, now: float | None = None) -> tuple[list[Watch], bool]:
        """(requests hung alone, whether the whole engine is stalled)."""
        if not self.stall_timeout or not self.watches:
            return [], False
        now = time.monotonic() if now is None else now
        overdue = [w for w in self.watches if self.overdue(w, now) and w.failure is None]
        if overdue and len(overdue) == len(self.watches):
            return [], True
        return [w for w in overdue if w.started or self._overtaken(w)], False

    def _overtaken(self, watch: Watch) -> bool:
        """A request of ``watch``'s priority or a lower one (served after it) that reached the engine later
        has started: the engine is not serving ``watch``'s turn. Higher priorities may pass it by design."""
        return any(entered > watch.entered for priority, entered in self._latest_start.items()
                   if priority >= watch.priority)

    def fail(self, watch: Watch, error: HyocrError) -> None:
        """End ``watch``'s request with ``error``: now if it is awaiting the engine, else at its next wait."""
        if watch.failure is not None:
            return
        watch.failure = error
        if watch.waiting and watch.task is not None and not watch.task.done():
            watch.task.cancel()

    def fail_all(self, error_for) -> int:
        """Fail every watched request (the engine is being restarted); ``error_for(watch)`` makes each error."""
        watches = [w for w in self.watches if w.failure is None]
        for watch in watches:
            self.fail(watch, error_for(watch))
        return len(watches)


def stalled_error(seconds: float) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"the engine made no progress on this request for {seconds:.0f} s; it was aborted, retry",
        code="engine_stalled", headers={"Retry-After": RETRY_AFTER},
    )


def restarting_error(reason: str) -> ServiceUnavailable:
    return ServiceUnavailable(
        f"the engine is being restarted ({reason}); retry shortly", code="engine_restarting",
        headers={"Retry-After": RETRY_AFTER},
    )
