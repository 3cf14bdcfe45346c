"""One call's retry decisions: attempts, deadline, backoff and Retry-After (no I/O: both clients)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable

from .errors import HyocrClientError

RETRY_AFTER_CAP = 10.0  # seconds: the longest Retry-After honoured
BACKOFF_CAP = 4.0  # seconds: the longest backoff between attempts


class RetryState:
    """One call's attempts and deadline, and the decision after each failure (no I/O: both clients)."""

    def __init__(self, timeout: float, max_retries: int, backoff: float, total_timeout: float | None = None,
                 uniform: Callable[[float, float], float] = random.uniform) -> None:
        self.timeout, self.max_retries, self.backoff, self.uniform = timeout, max_retries, backoff, uniform
        self.explicit = total_timeout is not None  # the caller's bound on the whole call, documents included
        if total_timeout is None:
            backoffs = sum(self.nominal_backoff(n) for n in range(1, max_retries + 1))
            total_timeout = (max_retries + 1) * timeout + backoffs
        self.total = total_timeout
        self.deadline = time.monotonic() + total_timeout
        self.attempt, self.call_id = 0, uuid.uuid4().hex

    def nominal_backoff(self, retry: int) -> float:
        return min(BACKOFF_CAP, self.backoff * 2 ** (retry - 1))

    def progressed(self) -> float:
        """A page came: the default deadline (room for the attempts) moves past it, so that a long document
        read page by page keeps its retries; a ``total_timeout`` the caller gave stays. The deadline."""
        if not self.explicit:
            self.deadline = max(self.deadline, time.monotonic() + self.total)
        return self.deadline

    def start(self) -> tuple[float, str]:
        """Begin an attempt: its timeout (never past the deadline) and its X-Request-ID."""
        self.attempt += 1
        remaining = max(self.deadline - time.monotonic(), 0.001)
        return min(self.timeout, remaining), f"{self.call_id}.{self.attempt}"

    def wait_before_retry(self, error: HyocrClientError) -> float | None:
        """Seconds to sleep before the next attempt, or None: give up and raise ``error``."""
        error.attempts = self.attempt
        if self.attempt > self.max_retries or not error.retryable:
            return None
        retry_after = getattr(error, "retry_after", None)
        remaining = self.deadline - time.monotonic()
        if retry_after is not None:  # when it ends past our deadline, sleeping on it is wasted time
            if retry_after >= remaining:
                return None
            wait = min(retry_after, RETRY_AFTER_CAP)
            # a little past it, spread: the clients a 503 turned away all at once would come back at once
            return min(wait + self.uniform(0.0, min(1.0, 0.1 + 0.2 * wait)), max(remaining - 0.001, wait))
        wait = self.nominal_backoff(self.attempt) * self.uniform(0.5, 1.0)  # "equal jitter"
        return wait if wait < remaining else None
