"""Structured logs: one JSON line per request, and JSON for every other log line too.

The access line carries the request id (``X-Request-ID``), the caller's identity as the auth
middleware named it (a key digest, never the key), route, status, duration, and what the service
recorded for the request: image bytes and pixels, tokens, stage timings. Never document content.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import exception_chain
from .tracing import span

# Filled by the service while it handles a request (image sizes, tokens, timings); read by the
# access log when the response is done. A dict per request, shared with the tasks it spawns.
request_stats: contextvars.ContextVar[dict | None] = contextvars.ContextVar("hyocr_request_stats", default=None)
access_log = logging.getLogger("hyocr.access")


def record_first(**values: object) -> None:
    """Like ``record``, but keeps the first value (time to first token of a multi-page request)."""
    stats = request_stats.get()
    if stats is not None:
        for key, value in values.items():
            stats.setdefault(key, value)


def record(**values: object) -> None:
    """Add figures to the current request's access-log line (no-op outside a request)."""
    stats = request_stats.get()
    if stats is not None:
        for key, value in values.items():
            if isinstance(value, (int, float)) and isinstance(stats.get(key), (int, float)):
                stats[key] += value  # pages of one request add up
            else:
                stats[key] = value


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info and record.exc_info[1] is not None:
            # every cause, one line: a traceback's last line alone can be a library's footnote (SQLAlchemy's
            # "(Background on this error at: ...)" hid "database or disk is full")
            line["error"] = exception_chain(record.exc_info[1])
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(level: str, fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # httpx logs each request's whole URL at INFO: a webhook's or an upstream's query string may hold a token.
    # hyocr logs what it sends in its own words (a callback by its host); httpx's own lines only at debug.
    logging.getLogger("httpx").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING)


class AccessLogMiddleware:
    """Outermost but one (inside the request id): sees every response, including refusals."""

    def __init__(self, app: ASGIApp, metrics=None) -> None:
        self.app = app
        self.metrics = metrics  # observability.metrics.Metrics: counted from the same figures as the line

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        stats: dict = {}
        token = request_stats.set(stats)
        status = [500]
        progress = {"started": False, "complete": False}

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                progress["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                progress["complete"] = True
            await send(message)

        failed = False
        try:
            with span("hyocr.request", method=scope.get("method"), path=scope.get("path", "")[:100],
                      request_id=scope.get("state", {}).get("request_id")):
                await self.app(scope, receive, send_status)
        except BaseException:
            failed = True
            raise
        finally:
            request_stats.reset(token)
            state = scope.get("state", {})
            if state.get("client_gone"):
                status[0] = 499  # it left before its request had arrived (api/errors.py)
            elif progress["started"] and not progress["complete"] and not failed:
                # The app returned with its response half sent: only a client that left does that (a
                # stream whose reader hung up). 499, as for a non-streamed request whose client left:
                # the client did not get the whole response, whatever the status line said.
                status[0] = 499
            route = scope.get("route")
            fields = {
                "request_id": state.get("request_id"),
                "principal": state.get("principal"),
                "method": scope.get("method"),
                "route": getattr(route, "path", None) or scope.get("path", "")[:100],
                "status": status[0],
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                **stats,
            }
            access_log.info("request", extra={"fields": fields})
            if self.metrics is not None:
                self.metrics.observe(fields["route"], status[0], fields["duration_ms"] / 1000, stats)
