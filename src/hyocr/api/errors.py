"""Every failure leaves the API as ``{"error": {"message", "type", "param", "code"}}``.

This is the one place exceptions become HTTP responses. Internal errors never carry their message,
a traceback or a repr to the client: they are logged with the request id, and the client gets the id.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import HyocrError, ServiceUnavailable, exception_chain, root_cause_type
from .limits import send_json_error

log = logging.getLogger("hyocr.api")

_HTTP_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


MESSAGE_CHARS = 2000  # of an error message: one that quotes a client's value never echoes megabytes of it


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    if len(message) > MESSAGE_CHARS:
        message = f"{message[:MESSAGE_CHARS - 30]}... ({len(message)} characters)"  # within MESSAGE_CHARS
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


def request_id_of(request: Request) -> str:
    return getattr(request.state, "request_id", None) or "-"


def internal_message(request_id: str) -> str:
    """What a client is told of an internal failure: its request id, to quote, and nothing else."""
    return f"internal error (request id {request_id})"


def log_unexpected(request_id: str) -> str:
    """Log the exception being handled, with its traceback; return the client's message."""
    log.exception("request %s failed with an unexpected error", request_id)
    return internal_message(request_id)


def error_headers(exc: HyocrError) -> dict[str, str]:
    """The headers an error response carries: the error's own, and for every 503 a ``Retry-After``
    (the raiser's where it knows one, else the class default), so no code path can forget it."""
    headers = dict(exc.headers or {})
    if exc.status == 503 and not any(k.lower() == "retry-after" for k in headers):
        headers["Retry-After"] = str(getattr(exc, "retry_after", ServiceUnavailable.retry_after))
    return headers


def hyocr_error_body(exc: HyocrError, request_id: str) -> tuple[int, dict]:
    """The status and body of ``exc`` for the client; an internal one is logged here, with the request id,
    whichever way it leaves (a response, a stream's error event). Its message (an engine's holds the
    exception chain) stays in the log; the client sees the id and the root cause's type."""
    if exc.public:
        return exc.status, error_body(exc.message, exc.type, exc.param, exc.code)
    log.error("request %s failed: %s: %s", request_id, type(exc).__name__, exc.message)
    return exc.status, error_body(exc.shown(internal_message(request_id)), exc.type, None, exc.code)


# pydantic names a union's branch in an error's location ("str", "constrained-str", "list[ContentPart]"):
# no request field is spelt so, and the caller needs the field, not the branch
# (and a model's class name, "ImageURL"); a tagged union repeats its tag before the field ("text.text")
_BRANCH = re.compile(r"^(?:str|int|float|bool|constrained-\w+|[\w-]+\[.*\]|[A-Z][A-Za-z]*[a-z][A-Za-z]*|[A-Z]+)$")


def validation_message(errors: list) -> tuple[str, str | None]:
    """One pydantic error as one readable line, and the parameter it concerns. Of a union's errors the one
    that went deepest into the value is meant: a list of content parts with a bad part is about that part,
    not about not being a string (the first branch)."""
    if not errors:
        return "invalid request", None
    err = _chosen(errors)
    if err.get("type") == "json_invalid":  # where, when the parser says (a lone surrogate's escape, a cut body)
        where = str((err.get("ctx") or {}).get("error") or "")[:200]
        return "request body is not valid JSON" + (f": {where}" if where else ""), None
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
    fields = [p for p in loc if not _BRANCH.match(p)]
    param = ".".join(p for i, p in enumerate(fields) if i == 0 or p != fields[i - 1] or p.isdigit()) or None
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if err.get("type") == "string_too_long":
        msg = "the text is too long (" + msg[0].lower() + msg[1:] + ")"
    return (f"{param}: {msg}" if param else msg), param


def validation_code(errors: list) -> str | None:
    """The error code of ``validation_message``'s error: ``text_too_long`` as chat's own length check says."""
    return "text_too_long" if errors and _chosen(errors).get("type") == "string_too_long" else None


def _chosen(errors: list) -> dict:
    return max(errors, key=lambda e: len(e.get("loc", ())))  # max keeps the first of equals


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HyocrError)
    async def _hyocr(request: Request, exc: HyocrError) -> JSONResponse:
        status, body = hyocr_error_body(exc, request_id_of(request))
        return JSONResponse(body, status_code=status, headers=error_headers(exc) or None)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc.errors())
        return error_response(400, message, "invalid_request_error", param, validation_code(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _pydantic(request: Request, exc: ValidationError) -> JSONResponse:
        message, param = validation_message(exc.errors())
        return error_response(400, message, "invalid_request_error", param, validation_code(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 503:
            headers.setdefault("Retry-After", str(ServiceUnavailable.retry_after))
        return error_response(
            exc.status_code,
            message,
            _HTTP_TYPES.get(exc.status_code, "invalid_request_error" if exc.status_code < 500 else "internal_error"),
            headers=headers or None,
        )

    from sqlalchemy.exc import OperationalError

    @app.exception_handler(OperationalError)  # the jobs database: full, locked past its timeout, unreachable
    async def _storage(request: Request, exc: OperationalError) -> JSONResponse:
        request_id = request_id_of(request)
        log.error("request %s: the jobs database failed: %s", request_id, exception_chain(exc))
        return error_response(503, f"the jobs database cannot be used now ({root_cause_type(exc) or 'error'}); "
                              f"retry later (request id {request_id})", "server_error", None,
                              "storage_unavailable", headers={"Retry-After": "5"})

    @app.exception_handler(Exception)  # what escapes the outer middlewares (the inner one: below)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, log_unexpected(request_id_of(request)), "internal_error")


class UnexpectedErrorMiddleware:
    """The innermost middleware. An exception no handler took becomes the JSON 500 here: Starlette's own
    last resort (ServerErrorMiddleware, outermost) answers the same but then re-raises to the server, so
    uvicorn logs "Exception in ASGI application" and drops the client's keep-alive connection. A client that
    left while its body was arriving (ClientDisconnect) is not answered, there is nobody to answer: the
    access log records 499."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except ClientDisconnect:
            scope.setdefault("state", {})["client_gone"] = True
        except Exception:
            if started:  # half a response is out: only the server can end it
                raise
            message = log_unexpected(scope.get("state", {}).get("request_id") or "-")
            await send_json_error(send, 500, message, None, type_="internal_error")
