"""How hyocr runs uvicorn, in one process (``hyocr serve``) or in each of several (processes.py).

- The server tells the app's ``Drain`` (api/serving.py) when it starts stopping; uvicorn's own
  cancellation comes ``SHUTDOWN_GRACE`` seconds after the app has answered what was still running.
- What the HTTP parser refuses (a NUL or CR in a header, a bad Content-Length, a header block past h11's
  size limit) never reaches the app: the protocol classes here answer uvicorn's 400 in the API's JSON
  shape, with an ``X-Request-ID`` (tests/integration/test_serving_errors.py runs both parsers).
- A request's headers are bounded before anything reads them (``HeaderGuard``): HEADER_BYTES in all (a 431),
  within HEADER_TIMEOUT seconds of the connection or of the request's first byte (a 408). httptools, the
  parser uvicorn picks where installed, has neither: a client could send a gigabyte of header or one header
  line every few seconds, before authentication, and hold memory or a connection for as long as it liked.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import uuid
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from ..api.serving import Drain
    from ..config import Settings

log = logging.getLogger("uvicorn.error")  # beside uvicorn's own start and stop lines
# uvicorn cancels what is left this long after DRAIN_TIMEOUT (the app answers at DRAIN_TIMEOUT).
SHUTDOWN_GRACE = 2.0
# The exit status of a failed start, as uvicorn uses it (older uvicorn releases do not name it STARTUP_FAILURE).
STARTUP_FAILURE = 3
# A request line and headers: nginx allows 4 x 8 KiB, h11 16 KiB; room for long JWTs and proxies' headers.
HEADER_BYTES = 64 * 1024
# The request line alone, checked before the parser sees it: httptools refuses a URL past 65,535 bytes with a 400
# of its own, and asyncio without uvloop reads 256 KiB at once, so past this it is a 414 whichever parser reads.
REQUEST_LINE_BYTES = 60 * 1024
# From a connection's opening, or a request's first byte, to the end of its headers (nginx: 60 s).
HEADER_TIMEOUT = 30.0


def uvicorn_options(settings: Settings) -> dict:
    """uvicorn's options for hyocr's app, in one process or in each of several."""
    return {
        "log_level": settings.log_level,
        "log_config": None,  # keep the handlers hyocr set up (JSON lines)
        "access_log": False,  # hyocr writes its own access line (observability/logs.py)
        # The app answers what is still running at DRAIN_TIMEOUT (api/serving.py); uvicorn cancels what
        # ignored that a little later.
        "timeout_graceful_shutdown": settings.drain_timeout + SHUTDOWN_GRACE,
        # The parser's 400 for malformed HTTP in the API's JSON shape.
        "http": http_protocol(),
        # hyocr believes X-Forwarded-For only from HYOCR_TRUSTED_PROXIES (api/security.py); uvicorn's
        # own proxy handling would rewrite the client address before hyocr could judge it.
        "proxy_headers": False,
    }


class Server(uvicorn.Server):
    """uvicorn's server, telling the app's ``Drain`` when it starts stopping."""

    def __init__(self, config: uvicorn.Config, drain: Drain | None = None) -> None:
        super().__init__(config)
        self.drain = drain

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        """uvicorn's start-up; with sockets handed over (bound before the engine loaded, listened to now), a
        socket that is not listening afterwards is a failed start: another program that binds with
        SO_REUSEADDR can take the port while the engine loads, and uvloop's create_server then returns with
        no socket, silently (the stdlib loop raises)."""
        failure: OSError | None = None
        where = _address(sockets[0]) if sockets else ""  # now: uvloop may have let go of a socket it failed on
        try:
            await super().startup(sockets=sockets)
        except OSError as exc:
            failure = exc
        if sockets is None:
            return
        if failure is not None or not all(_listening(sock) for sock in sockets):
            log.error("cannot listen on %s: %s", where,
                      failure.strerror if failure else "another program took the port while the engine loaded")
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)
        if self.started:  # uvicorn names the address only of a socket it opened itself
            log.info("Uvicorn running on %s://%s (Press CTRL+C to quit)", "https" if self.config.ssl else "http",
                     where)

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        if self.drain is not None:
            self.drain.begin()
        await super().shutdown(sockets=sockets)


def _listening(sock: socket.socket) -> bool:
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:
        return False


def _address(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return "its socket"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------- malformed HTTP as JSON


def _json_error(message: str, code: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-request-id", uuid.uuid4().hex.encode()), (b"connection", b"close")]
    return body, headers


def _json_400(message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    return _json_error(f"malformed HTTP request: {message}", "bad_http_request")


_PARSER_MESSAGE = "the HTTP parser refused it (e.g. a control character in a header, a bad Content-Length)"


def _header_part(data: bytes) -> int:
    """How much of a read is headers: up to the blank line that ends them, or all of it. A read that starts in
    the middle of the terminator, or one with a body after it, is counted by its header part alone."""
    ends = [i + n for i, n in ((data.find(b"\r\n\r\n"), 4), (data.find(b"\n\n"), 2)) if i != -1]
    return min(ends) if ends else len(data)


class HeaderGuard:
    """Mixed into uvicorn's protocol classes: a request whose headers pass HEADER_BYTES is answered 431 (a
    request line past REQUEST_LINE_BYTES 414), one whose headers are not in HEADER_TIMEOUT seconds after the
    connection opened (or after its first byte, on a kept-alive connection) 408, and the connection closed.
    Counted by what arrived while the headers were incomplete, so memory stays within HEADER_BYTES and one
    read. Between requests uvicorn's keep-alive timeout closes an idle connection, as before."""

    _guard_timer = None
    _guard_bytes = 0
    _guard_line = False  # the request line has ended: no more of it to measure against REQUEST_LINE_BYTES

    def _headers_in(self) -> bool:  # the parser has the current request's headers
        raise NotImplementedError

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        super().connection_made(transport)  # type: ignore[misc]
        self._guard_arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard_disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if not self._headers_in():  # measured before the parser sees them: one read may hold all the headers
            if not self._guard_line:  # the request line still coming: its length first
                end = data.find(b"\n")
                if self._guard_bytes + (len(data) if end == -1 else end) > REQUEST_LINE_BYTES:
                    self._guard_refuse(414, "URI Too Long", f"the request line is longer than {REQUEST_LINE_BYTES} "
                                       "bytes", "uri_too_long")
                    return
            if self._guard_bytes + _header_part(data) > HEADER_BYTES:
                self._guard_refuse(431, "Request Header Fields Too Large",
                                   f"the request's headers are larger than {HEADER_BYTES} bytes", "headers_too_large")
                return
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():  # type: ignore[attr-defined]
            self._guard_disarm()
        elif self._headers_in():
            self._guard_disarm()
        else:  # headers still coming: this read counts, and the clock runs from the request's first byte
            self._guard_arm()
            self._guard_bytes += len(data)
            self._guard_line = self._guard_line or b"\n" in data

    def _guard_arm(self) -> None:
        if self._guard_timer is None:
            self._guard_timer = self.loop.call_later(HEADER_TIMEOUT, self._guard_expired)  # type: ignore[attr-defined]

    def _guard_disarm(self) -> None:
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None
        self._guard_bytes = 0
        self._guard_line = False

    def _guard_expired(self) -> None:
        self._guard_timer = None
        if not self._headers_in():
            self._guard_refuse(408, "Request Timeout",
                               f"the request's headers did not arrive within {HEADER_TIMEOUT:g} s", "header_timeout")

    def _guard_refuse(self, status: int, reason: str, message: str, code: str) -> None:
        self._guard_disarm()
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing():
            return
        body, headers = _json_error(message, code)
        content = [f"HTTP/1.1 {status} {reason}\r\n".encode()]
        for name, value in [*self.server_state.default_headers, *headers]:  # type: ignore[attr-defined]
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"\r\n", body])
        transport.write(b"".join(content))
        transport.close()


def http_protocol() -> type:
    """The HTTP protocol class uvicorn's ``auto`` would pick (httptools where installed, else h11), with
    the parser's 400 answered in JSON."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return h11_protocol()
    return httptools_protocol()


def httptools_protocol() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class JsonErrorHttpToolsProtocol(HeaderGuard, HttpToolsProtocol):
        _headers_done = False

        def _headers_in(self) -> bool:
            return self._headers_done

        def on_message_begin(self) -> None:
            self._headers_done = False
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._headers_done = True
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            idle = not self.pipeline  # no pipelined request whose headers are in: the next bytes are new headers
            super().on_response_complete()
            if idle:
                self._headers_done = False

        def send_400_response(self, msg: str) -> None:
            body, headers = _json_400(_PARSER_MESSAGE)
            content = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in [*self.server_state.default_headers, *headers]:
                content.extend([name, b": ", value, b"\r\n"])
            content.extend([b"\r\n", body])
            self.transport.write(b"".join(content))
            self.transport.close()

    return JsonErrorHttpToolsProtocol


def h11_protocol() -> type:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorH11Protocol(HeaderGuard, H11Protocol):
        def _headers_in(self) -> bool:  # h11 leaves IDLE once a request's headers are in
            return self.conn.their_state is not h11.IDLE

        def send_400_response(self, msg: str) -> None:
            body, headers = _json_400(_PARSER_MESSAGE)
            event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            self.transport.write(self.conn.send(event))
            self.transport.write(self.conn.send(event=h11.Data(data=body)))
            self.transport.write(self.conn.send(event=h11.EndOfMessage()))
            self.transport.close()

    return JsonErrorH11Protocol
