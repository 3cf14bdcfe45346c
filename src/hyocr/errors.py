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
(``hyocr.api.errors``). Only ``public`` errors show their message; internal ones say "internal error", and
an engine failure adds the type of the exception at the root of it (``cause_type``), never its message.
"""

from __future__ import annotations

import logging
import re
import traceback

log = logging.getLogger("hyocr.engines")

CHAIN_LINKS = 8  # exceptions of a chain described (the outermost first)
CHAIN_MESSAGE_CHARS = 300  # of each one's message
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


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
        cause_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        # The class name of the exception at the root of an internal error (ModuleNotFoundError): shown to the
        # client where the message is not, so that a report says more than "internal error".
        self.cause_type = cause_type

    def shown(self, internal: str = "internal error") -> str:
        """What a client may read of this error: the message of a public one; for an internal one
        ``internal`` and the root cause's type."""
        if self.public:
            return self.message
        return f"{internal}: {self.cause_type}" if self.cause_type else internal


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


def exception_chain(exc: BaseException) -> str:
    """``exc`` and what caused it, outermost first, as one bounded line:
    ``EngineGenerateError <- ModuleNotFoundError: No module named 'lmformatenforcer'``. vLLM raises
    ``EngineGenerateError()`` with no message ``from`` the real error: without its causes a log says nothing."""
    chain, links = _chain(exc), []
    for link in chain[:CHAIN_LINKS]:
        try:
            text = " ".join(str(link).split())[:CHAIN_MESSAGE_CHARS]  # one line
        except Exception:  # noqa: BLE001 - an exception whose __str__ fails still has a type to name
            text = "(no printable message)"
        links.append(f"{type(link).__name__}: {text}" if text else type(link).__name__)
    more = len(chain) - CHAIN_LINKS
    return " <- ".join(links) + (f" <- ({more} more)" if more > 0 else "")


def root_cause_type(exc: BaseException) -> str | None:
    """The class name of the innermost exception of ``exc``'s chain, if it reads as a plain class name: what a
    client may be told of an internal failure (a name says what failed; a message may hold paths, addresses,
    reprs of the request)."""
    name = type(_chain(exc)[-1]).__name__
    return name if _TYPE_NAME.fullmatch(name) else None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its ``__cause__`` (or the ``__context__`` it was raised in), theirs, ...: each once."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and all(link is not seen for seen in chain) and len(chain) < 4 * CHAIN_LINKS:
        chain.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return chain


def engine_failure(exc: BaseException, what: str) -> HyocrError:
    """An engine exception as the client should see it: out of GPU memory (anywhere in its chain) is a 503
    the client may retry (and ``hyocr bench`` counts as OOM); anything else an internal engine error whose
    message, logged by whoever reports it, holds the whole chain, and whose ``cause_type`` the client sees.
    The traceback goes to the debug log."""
    chain = exception_chain(exc)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s: %s\n%s", what, chain, "".join(traceback.format_exception(exc)).rstrip())
    if any(type(link).__name__ == "OutOfMemoryError" for link in _chain(exc)) or "out of memory" in chain.lower():
        log.warning("%s: the GPU ran out of memory: %s", what, chain)
        return ServiceUnavailable("the GPU ran out of memory; retry later or send smaller images",
                                  code="out_of_memory")
    return EngineError(f"{what}: {chain}", cause_type=root_cause_type(exc))
