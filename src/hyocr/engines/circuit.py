"""A circuit breaker for engines that can fail as a whole (a remote upstream, a crashed engine).

closed: calls pass; ``failure_threshold`` consecutive failures open it.
open: calls fail fast (503 with Retry-After) for ``reset_timeout`` seconds.
half-open: one probe call passes; success closes the breaker, failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import ServiceUnavailable


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        failure_threshold: int = 5,
        reset_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._clock() - self._opened_at >= self.reset_timeout:
            return "half-open"
        return "open"

    def before_call(self) -> bool:
        """Raise ServiceUnavailable while open; let one probe through when half-open (True: this call is the
        probe, which must end in ``success``, ``failure`` or ``release``, or no other call passes again)."""
        state = self.state
        if state == "closed":
            return False
        if state == "half-open" and not self._probing:
            self._probing = True
            return True
        assert self._opened_at is not None
        wait = max(1, round(self.reset_timeout - (self._clock() - self._opened_at)))
        raise ServiceUnavailable(
            f"{self.name} is failing; retrying it in {wait}s",
            code="circuit_open",
            headers={"Retry-After": str(wait)},
        )

    def success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._probing = False

    def failure(self) -> None:
        self._failures += 1
        if self._probing or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
        self._probing = False

    def release(self) -> None:
        """The probe ended without a verdict (its caller hung up, its deadline passed): the next call probes."""
        self._probing = False


class Verdict:
    """One call's outcome, recorded in its breaker once: the first of ``success`` and ``failure`` counts."""

    def __init__(self, breaker: CircuitBreaker) -> None:
        self.breaker, self.given = breaker, False

    def success(self) -> None:
        if not self.given:
            self.given = True
            self.breaker.success()

    def failure(self) -> None:
        if not self.given:
            self.given = True
            self.breaker.failure()
