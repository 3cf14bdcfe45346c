"""The hyocr exception tree. Every error knows its HTTP status and OpenAI error type.

    HyocrError (500, internal_error)          never shows its message to clients
    +-- InvalidRequest (400)                   bad parameters, malformed JSON, unknown task
    |   +-- UnsupportedTask (400)              the engine cannot do this task
    |   +-- InvalidMedia (400)                 not an image, bad base64, truncated file
    +-- AuthenticationFailed (401)
    +-- Forbidden (403)
    +-- NotFound (404)
    +-- BodyTimeout (408)                      the request body did not arrive in time
    +-- Conflict (409)                         not in a state to answer that yet (a job still running)
    +-- PayloadTooLarge (413)                  body, image bytes or pixels over a cap
    +-- UnsupportedMediaType (415)             a format outside the allowlist
    +-- UnprocessableDocument (422)            a PDF that could not be rendered in time or crashed the renderer
    +-- IdempotencyKeyReused (422)             an Idempotency-Key sent again with another request
    +-- RateLimited (429)
    +-- ServiceUnavailable (503)               engine not ready, overloaded, circuit open
    +-- GatewayTimeout (504)                   request deadline passed
    +-- EngineError (500)                      the engine failed on this request

The API maps them to ``{"error": {"message", "type", "param", "code"}}`` in one place
(``hyocr.api.errors``). Only ``public`` errors show their message; internal ones say "internal error".
"""

from __future__ import annotations


class HyocrError(Exception):
    status: int = 500
    type: str = "internal_error"
    code: str | None = None
    public: bool = False  # may the message be shown to the client?

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class InvalidRequest(HyocrError):
    status = 400
    type = "invalid_request_error"
    public = True


class UnsupportedTask(InvalidRequest):
    code = "unsupported_task"


class InvalidMedia(InvalidRequest):
    code = "invalid_image"


class AuthenticationFailed(HyocrError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    public = True


class Forbidden(HyocrError):
    status = 403
    type = "permission_error"
    public = True


class NotFound(HyocrError):
    status = 404
    type = "not_found_error"
    public = True


class BodyTimeout(HyocrError):
    """The request body did not arrive in time (a stalled or slowloris upload)."""

    status = 408
    type = "invalid_request_error"
    code = "body_timeout"
    public = True


class Conflict(HyocrError):
    """The resource exists but cannot answer that now: a job's result before it succeeded."""

    status = 409
    type = "invalid_request_error"
    public = True


class PayloadTooLarge(HyocrError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"
    public = True


class UnsupportedMediaType(HyocrError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"
    public = True


class RateLimited(HyocrError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"
    public = True


class UnprocessableDocument(HyocrError):
    """A well-formed request whose document (a PDF) could not be rendered in time or crashed the renderer."""

    status = 422
    type = "invalid_request_error"
    code = "pdf_render_failed"
    public = True


class IdempotencyKeyReused(HyocrError):
    """An Idempotency-Key sent again with a different request (payment and cloud APIs answer 422)."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"
    public = True


class ServiceUnavailable(HyocrError):
    """503: the request was fine, the server cannot take it now. Every 503 leaves with ``Retry-After``:
    the one in ``headers`` where the raiser knows better (a circuit breaker's wait, an upstream's own),
    else ``retry_after`` seconds (api/errors.py adds it, for every code, present and future)."""

    status = 503
    type = "service_unavailable"
    public = True
    retry_after: int = 1


class GatewayTimeout(HyocrError):
    status = 504
    type = "timeout_error"
    code = "request_timeout"
    public = True


class EngineError(HyocrError):
    """The engine failed on this request. Its message may hold internals, so it stays private."""

    status = 500
    type = "engine_error"


def engine_failure(exc: BaseException, what: str) -> HyocrError:
    """An engine exception as the client should see it: out of GPU memory is a 503 the client may retry
    (and ``hyocr bench`` counts as OOM); anything else an internal engine error."""
    text = f"{type(exc).__name__}: {exc}"
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in text.lower():
        return ServiceUnavailable("the GPU ran out of memory; retry later or send smaller images",
                                  code="out_of_memory")
    return EngineError(f"{what}: {text}")

