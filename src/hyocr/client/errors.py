"""The exception tree, and the typed error for a non-2xx answer or a transport failure."""

from __future__ import annotations

import httpx

_RETRY_STATUS = frozenset({429, 502, 503, 504})


class HyocrClientError(Exception):
    """Base of everything this client raises."""

    def __init__(self, message: str, *, request_id: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.message, self.request_id, self.retryable = message, request_id, retryable
        self.attempts = 1  # requests sent for this call


class Timeout(HyocrClientError): """No answer within the timeout, on every attempt."""
class ConnectionFailed(HyocrClientError): """Unreachable, or the connection dropped before an answer."""


class APIError(HyocrClientError):
    """The server answered with an error: its ``{"error": {...}}`` body, status and ``X-Request-ID``."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, request_id: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message, request_id=request_id, retryable=status in _RETRY_STATUS)
        self.status, self.type, self.param, self.code = status, type, param, code
        self.retry_after = retry_after  # seconds, from Retry-After

    def __str__(self) -> str:
        extra = "".join(f", {k}={v}" for k, v in (("param", self.param), ("code", self.code)) if v)
        rid = f" (request id {self.request_id})" if (self.request_id or "") not in self.message else ""
        return f"HTTP {self.status}: {self.message}{extra}{rid}"


# One-liners by status (PEP 8: related one-liners may go without blank lines).
class BadRequest(APIError): """400/413/415/422: parameters, image, size or format; retrying won't help."""
class AuthenticationError(APIError): """401."""
class PermissionDenied(APIError): """403."""
class NotFound(APIError): """404."""
class Conflict(APIError): """409: a job's result asked for before it succeeded (job_not_finished, ...)"""
class RateLimited(APIError): """429 after the retries; ``retry_after``: when the server expects more."""
class ServerError(APIError): """500 and other 5xx: the server failed on this request."""
class ServiceUnavailable(APIError): """503 (not ready, overloaded, draining), 502/504 (a proxy, a deadline)"""


_ERROR_CLASSES: dict[int, type[APIError]] = {
    400: BadRequest, 413: BadRequest, 415: BadRequest, 422: BadRequest, 401: AuthenticationError,
    403: PermissionDenied, 404: NotFound, 409: Conflict, 429: RateLimited, 500: ServerError,
    502: ServiceUnavailable, 503: ServiceUnavailable, 504: ServiceUnavailable,
}


def error_from_response(response: httpx.Response) -> APIError:
    """The typed error for a non-2xx answer; a non-JSON body (a proxy's HTML page) gets a generic message."""
    status = response.status_code
    try:
        detail = response.json().get("error")
    except (ValueError, AttributeError):
        detail = None
    ours = isinstance(detail, dict)  # hyocr's own error body, not a proxy's page
    if not ours:
        detail = {"message": f"HTTP {status} {response.reason_phrase}".strip()}
    try:  # Retry-After in seconds (decimals tolerated); the HTTP-date form is ignored
        retry_after: float | None = max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        retry_after = None
    cls = _ERROR_CLASSES.get(status) or (ServerError if status >= 500 else APIError)
    error = cls(status, str(detail.get("message") or f"HTTP {status}"), type=detail.get("type"),
                param=detail.get("param"), code=detail.get("code"),
                request_id=response.headers.get("x-request-id"), retry_after=retry_after)
    error.retryable &= not (ours and status == 504)  # hyocr's own deadline passed: it would pass again
    return error


def error_from_transport(exc: httpx.TransportError, timeout: float, request_id: str) -> HyocrClientError:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return Timeout(f"no answer within {timeout:g} s", request_id=request_id, retryable=True)
    # A ConnectTimeout sent nothing: the server is unreachable. Not retried: LocalProtocolError,
    # UnsupportedProtocol, ProxyError (our request or setup is wrong).
    retryable = isinstance(exc, httpx.NetworkError | httpx.RemoteProtocolError | httpx.ConnectTimeout)
    return ConnectionFailed(f"{type(exc).__name__}: {exc}", request_id=request_id, retryable=retryable)
