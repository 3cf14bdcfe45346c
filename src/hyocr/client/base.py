"""What both clients share: settings, and the decision after each attempt."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx

from .. import __version__
from .calls import Call
from .errors import APIError, error_from_response, error_from_transport
from .retry import RetryState


def _seconds(name: str, value: float) -> None:
    """A timeout is a finite number of seconds above 0 (0, a negative, NaN or infinity: ValueError, said here)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds above 0, not {value!r}")


class _Base:
    """Settings and the decision after each attempt; the subclasses only send and sleep."""

    _http_class: Callable[..., Any]  # httpx.Client or httpx.AsyncClient
    _default_sleep: Callable[[float], Any]

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: str | None = None,
                 timeout: float = 3.0, max_retries: int = 2, backoff: float = 0.25,
                 total_timeout: float | None = None, transport: Any = None, sleep: Any = None) -> None:
        """``transport`` (an httpx transport) and ``sleep`` let tests fake the network and the waits."""
        _seconds("timeout", timeout)
        if total_timeout is not None:
            _seconds("total_timeout", total_timeout)
        if max_retries < 0 or backoff < 0:
            raise ValueError("max_retries and backoff must be >= 0")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")  # an OpenAI-style base URL works too
        self.timeout, self.max_retries, self.backoff = timeout, max_retries, backoff
        self.total_timeout = total_timeout
        self.headers = {"User-Agent": f"hyocr-client/{__version__}"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._sleep = sleep or self._default_sleep
        self._http = self._http_class(base_url=self.base_url, headers=self.headers, transport=transport)

    def _retry_state(self, call: Call) -> RetryState:
        if call.timeout is not None:  # 0 used to mean the default, silently
            _seconds("timeout", call.timeout)
        return RetryState(call.timeout or self.timeout, 0 if call.probe else self.max_retries,
                          self.backoff, None if call.timeout else self.total_timeout)

    @staticmethod
    def _settle(state: RetryState, call: Call, result: httpx.Response | httpx.TransportError,
                timeout: float, request_id: str) -> tuple[bool, Any]:
        """(True, value): return it. (False, seconds): sleep, then try again. Raises when giving up."""
        if isinstance(result, httpx.Response) and (result.is_success or call.probe):
            try:
                return True, call.parse(result)
            except ValueError:  # a proxy's page with a 200, say
                raise APIError(result.status_code, "the server's answer is not JSON",
                               request_id=result.headers.get("x-request-id")) from None
            except (KeyError, TypeError, AttributeError) as exc:  # JSON, but not the shape hyocr answers
                raise APIError(result.status_code, f"the server's answer is not what hyocr sends "
                               f"({type(exc).__name__}: {exc})"[:300],
                               request_id=result.headers.get("x-request-id")) from None
        error, cause = ((error_from_response(result), None) if isinstance(result, httpx.Response)
                        else (error_from_transport(result, timeout, request_id), result))
        wait = state.wait_before_retry(error)
        if wait is not None:
            return False, wait
        if call.probe:
            return True, False
        raise error from cause
