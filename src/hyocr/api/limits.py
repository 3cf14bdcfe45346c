"""Pure ASGI middleware that runs before any route: request ids and the body byte cap.

Pure ASGI (not BaseHTTPMiddleware) so streaming responses and client disconnects pass through
untouched, and so the cap applies while the body streams in, before a route buffers it.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import BodyTimeout, PayloadTooLarge

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# A refused body is read and dropped up to these bounds before the answer: a server that answers and closes while
# the client is still sending resets the connection (unread bytes in its socket), and the client's TCP stack then
# throws the 413 away. Past the bounds (a hostile or huge upload) the answer goes out anyway.
DRAIN_BYTES = 16 << 20
DRAIN_SECONDS = 5.0


async def send_json_error(
    send: Send, status: int, message: str, code: str | None, *, type_: str = "invalid_request_error",
    headers: list[tuple[bytes, bytes]] = (),
) -> None:
    """An OpenAI-shaped JSON error from middleware that answers before any route runs."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start_headers + list(headers)})
    await send({"type": "http.response.body", "body": body})


class RequestIdMiddleware:
    """Honours a well-formed ``X-Request-ID`` (else makes one) and returns it on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        await self.app(scope, receive, send_with_id)


async def drain(receive: Receive) -> None:
    """Read and drop the rest of a request body, bounded by DRAIN_BYTES and DRAIN_SECONDS."""
    seen = 0
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while seen <= DRAIN_BYTES:
                msg = await receive()
                if msg["type"] != "http.request":
                    return
                seen += len(msg.get("body", b""))
                if not msg.get("more_body", False):
                    return
    except TimeoutError:
        return


async def drain_before_refusal(receive: Receive, headers: dict[bytes, bytes]) -> None:
    """A refusal of a body the client may still be sending: what fits the drain bounds is read first. A client
    waiting for "100 Continue" sends nothing until asked, and a declared body past DRAIN_BYTES is not waited for."""
    declared = headers.get(b"content-length")
    if headers.get(b"expect", b"").lower() == b"100-continue":
        return
    if declared is None or (declared.isdigit() and int(declared) <= DRAIN_BYTES):
        await drain(receive)


class BodyLimitMiddleware:
    """413 from Content-Length before reading; mid-stream for chunked bodies that grow past the cap.
    408 for a body that has not arrived ``timeout`` seconds after its headers: without it a client that
    declares a body and never sends it holds its request (and a connection) forever. ``path_caps`` gives a
    route its own cap (a batch file upload is bigger than any one request)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 60.0,
                 path_caps: dict[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.path_caps = path_caps or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        cap = self.path_caps.get(scope.get("path", ""), self.max_bytes)
        message = f"request body is larger than the {cap} byte limit"
        # A gzip body read as JSON or an image would be a confusing 400. Every Content-Encoding line counts (the
        # last alone let "gzip" then "identity" through); a request without a body (a GET) is not refused.
        encodings = {part.strip().lower() for name, value in scope["headers"] if name == b"content-encoding"
                     for part in value.split(b",")} - {b"", b"identity"}
        has_body = (declared is not None and declared != b"0") or b"transfer-encoding" in headers
        if encodings and has_body:
            await drain_before_refusal(receive, headers)
            shown = b", ".join(sorted(encodings))[:32].decode("latin-1")
            await send_json_error(send, 415, f"Content-Encoding {shown!r} is not supported for request bodies: "
                                  "send the body uncompressed", "unsupported_content_encoding",
                                  headers=[(b"connection", b"close")])
            return
        if declared is not None:
            if not declared.isdigit():
                await send_json_error(send, 400, "invalid Content-Length header", "bad_request")
                return
            if int(declared) > cap:
                await drain_before_refusal(receive, headers)
                await send_json_error(send, 413, message, "payload_too_large", headers=[(b"connection", b"close")])
                return
        seen = 0
        complete = False
        deadline = asyncio.get_running_loop().time() + self.timeout
        tripped: BodyTimeout | PayloadTooLarge | None = None
        started = False

        async def counted_receive() -> Message:
            nonlocal seen, complete, tripped
            if complete:  # later receives wait for the client's disconnect, for as long as a response takes
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    msg = await receive()
            except TimeoutError:
                tripped = BodyTimeout(f"the request body did not arrive within {self.timeout:g} s",
                                      headers={"Connection": "close"})
                raise tripped from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > cap:
                    tripped = PayloadTooLarge(message, headers={"Connection": "close"})
                    if msg.get("more_body", False):
                        await drain(receive)
                    raise tripped
                complete = not msg.get("more_body", False)
            return msg

        # FastAPI reads a pydantic body itself and answers anything its read raises with a 400 "error parsing
        # the body" (chat, completions): once the cap or the deadline tripped, that answer is replaced by ours.
        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if tripped is not None and not started:
                return
            started = started or msg["type"] == "http.response.start"
            await send(msg)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except (BodyTimeout, PayloadTooLarge) as exc:
            if exc is not tripped or started:
                raise
        if tripped is not None and not started:
            await send_json_error(send, tripped.status, tripped.message, tripped.code,
                                  headers=[(b"connection", b"close")])
