"""What the app does about how it is served: the drain deadline's answers and the exposure warning.

- **Drain deadline.** On SIGTERM uvicorn stops accepting, waits ``timeout_graceful_shutdown`` for the
  requests in flight, then cancels them: a request not yet answered got uvicorn's plain-text 500 (no
  ``X-Request-ID``) and the log an "Exception in ASGI application" traceback. Here the server tells the
  app when it starts stopping (server/uvicorn.py: ``Server.shutdown`` -> ``Drain.begin``); at
  ``DRAIN_TIMEOUT`` the ``DrainMiddleware`` cancels what is still running itself and answers it: a JSON 503
  ``shutting_down`` with ``Retry-After`` when nothing was sent yet; a server-sent event stream of the API
  gets an error event and ``[DONE]`` and ends cleanly; any other response under way is ended where it
  stands (its status line has gone). uvicorn's own cancellation stays, ``SHUTDOWN_GRACE`` seconds later,
  for work that ignores cancellation.
- **Malformed HTTP** is uvicorn's side: server/uvicorn.py answers the parser's 400 in the API's JSON shape.
- **Exposure.** A server listening beyond loopback with neither keys nor an IP allowlist says so.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ServiceUnavailable
from ..observability.logs import record
from .limits import send_json_error

log = logging.getLogger("hyocr.serving")

_SHUTTING_DOWN = "the server is shutting down; retry the request"


class Drain:
    """The server's stop, as the app sees it: ``begin`` when the server stops accepting; ``timeout``
    seconds later the requests still running are cancelled and answered by ``DrainMiddleware``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task] = set()
        # Called when the stop begins: what holds a connection open with no work in it (the web UI's heartbeat
        # streams) ends then, or the server would wait DRAIN_TIMEOUT for an idle browser tab.
        self.on_begin: list[Callable[[], None]] = []

    def begin(self) -> None:
        if self._timer is None and not self.expired:
            self._timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
            for hook in self.on_begin:
                try:
                    hook()
                except Exception:  # a hook must not stop the drain
                    log.exception("a drain hook failed")

    def _expire(self) -> None:
        self.expired = True
        if self._running:
            log.warning("drain timeout (%gs): ending %d request(s) still running (503 shutting_down, or an "
                        "error event for a stream under way)", self.timeout, len(self._running))
        for task in list(self._running):
            task.cancel(_SHUTTING_DOWN)


class DrainMiddleware:
    """Answers the requests still running at the drain deadline (see the module's docstring). It sits
    inside the request id and the access log, so the 503 has an id and is logged and counted."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.drain
        if drain.expired:  # arrived after the deadline (a pipelined request): not started at all
            await _refuse(send)
            return
        task = asyncio.current_task()
        sent = {"started": False, "complete": False, "sse": False, "length": False}

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                sent["started"] = True
                sent["sse"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
                sent["length"] = b"content-length" in headers
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent["complete"] = True
            await send(message)

        if task is not None:
            drain._running.add(task)
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not drain.expired or task is None or task.cancelling() != 1:
                raise  # not (only) the drain's: uvicorn's own, or a cancellation of the server
            task.uncancel()
            await _answer_cut(scope, send, sent)
        finally:
            if task is not None:
                drain._running.discard(task)


async def _refuse(send: Send) -> None:
    record(rejected="shutting_down")
    wait = str(ServiceUnavailable.retry_after).encode()
    await send_json_error(send, 503, _SHUTTING_DOWN, "shutting_down", type_="service_unavailable",
                          headers=[(b"retry-after", wait), (b"connection", b"close")])


async def _answer_cut(scope: Scope, send: Send, sent: dict) -> None:
    if not sent["started"]:
        await _refuse(send)
        return
    if sent["complete"]:
        return
    record(ended_by="shutting_down")  # the access line of a response cut short by the stop
    if sent["sse"] and scope.get("path", "").startswith("/v1/"):
        # The API's streams end with an error event then [DONE], as any failure after the first event does.
        event = {"error": {"message": _SHUTTING_DOWN, "type": "service_unavailable", "param": None,
                           "code": "shutting_down"}}
        body = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": body, "more_body": True})
    if not sent["length"]:  # chunked: it can end here; a response with a length can only be cut off
        await send({"type": "http.response.body", "body": b"", "more_body": False})


# ---------------------------------------------------------------- exposure


def exposure(settings) -> dict:  # type: ignore[no-untyped-def]
    """How the server is reachable and guarded, for the start-up log and /v1/models."""
    api_keys = settings.api_keys.get_secret_value() if settings.api_keys else ""
    keys = bool(api_keys.replace(",", "").strip() or settings.jwt_secret or settings.jwt_public_key
                or settings.jwt_jwks_file)
    allowlist = bool(settings.allowed_ips)
    exposed = not _loopback(settings.host)
    info: dict = {"auth": keys, "ip_allowlist": allowlist, "exposed": exposed}
    if exposed and not keys and not allowlist:
        info["warning"] = (f"listening on {settings.host}, beyond loopback, with no API keys, JWT or IP allowlist: "
                           "anyone who can reach this address can use it (set HYOCR_API_KEYS or "
                           "HYOCR_ALLOWED_IPS, or HYOCR_HOST=127.0.0.1)")
    return info


def _loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def warn_if_exposed(settings) -> None:  # type: ignore[no-untyped-def]
    warning = exposure(settings).get("warning")
    if warning:
        log.warning("%s", warning)
