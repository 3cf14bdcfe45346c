"""How hyocr runs uvicorn, in one process (``hyocr serve``) or in each of several (processes.py).

- The server tells the app's ``Drain`` (api/serving.py) when it starts stopping; uvicorn's own
  cancellation comes ``SHUTDOWN_GRACE`` seconds after the app has answered what was still running.
- What the HTTP parser refuses (a NUL or CR in a header, a bad Content-Length, a header block past h11's
  size limit) never reaches the app: the protocol classes here answer uvicorn's 400 in the API's JSON
  shape, with an ``X-Request-ID`` (``send_400_response`` is the one method they replace;
  tests/integration/test_serving_errors.py runs both parsers).
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from ..api.serving import Drain
    from ..config import Settings

# uvicorn cancels what is left this long after DRAIN_TIMEOUT (the app answers at DRAIN_TIMEOUT).
SHUTDOWN_GRACE = 2.0


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

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        if self.drain is not None:
            self.drain.begin()
        await super().shutdown(sockets=sockets)


# ---------------------------------------------------------------- malformed HTTP as JSON


def _json_400(message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"message": f"malformed HTTP request: {message}", "type": "invalid_request_error",
                                 "param": None, "code": "bad_http_request"}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"x-request-id", uuid.uuid4().hex.encode()), (b"connection", b"close")]
    return body, headers


_PARSER_MESSAGE = "the HTTP parser refused it (e.g. a control character in a header, a bad Content-Length)"


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

    class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
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

    class JsonErrorH11Protocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            body, headers = _json_400(_PARSER_MESSAGE)
            event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            self.transport.write(self.conn.send(event))
            self.transport.write(self.conn.send(event=h11.Data(data=body)))
            self.transport.write(self.conn.send(event=h11.EndOfMessage()))
            self.transport.close()

    return JsonErrorH11Protocol
