"""Pure ASGI middleware that runs before any route: request ids, the body byte cap and the body budget.

Pure ASGI (not BaseHTTPMiddleware) so streaming responses and client disconnects pass through
untouched, and so the cap and the budget apply while the body streams in, before a route buffers it.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import BodyTimeout, PayloadTooLarge, ServiceUnavailable
from ..observability.logs import record

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# A refused body is read and dropped up to these bounds before the answer: a server that answers and closes while
# the client is still sending resets the connection (unread bytes in its socket), and the client's TCP stack then
# throws the 413 away. Past the bounds (a hostile or huge upload) the answer goes out anyway.
DRAIN_BYTES = 16 << 20
DRAIN_SECONDS = 5.0

# The body budget: request body bytes held at once by this process, across all requests. The cap above
# bounds one request; without a budget N concurrent bodies under it are N x 64 MiB buffered (routes read a
# JSON body or an upload whole) before admission or any per-tenant limit sees them: 24 bodies of 60 MB took
# a server from 389 to 1690 MiB; a few hundred would kill it for every tenant. A multiple of the cap, not a
# setting of its own: who raises MAX_BODY_BYTES expects bigger bodies and gets a budget that grows with it.
# 4 x 64 MiB = 256 MiB of bodies (~1x that in RSS, plus transient copies of the few being parsed) stays well
# inside the 3 GiB the CPU deployment gives the whole server, and still holds 60+ typical 4 MiB scans at
# once. Never below the largest route's cap: one maximal upload (a batch file) always fits an idle server.
# A request's bytes count from its first chunk until it is finished (answered, failed, or the client gone):
# the route holds its body that long. Per process: API_PROCESSES=N has N budgets.
BODY_BUDGET_MULTIPLE = 4
# A body's first SMALL_BODY_BYTES always pass (they still count): health checks, small JSON, a chat request
# with a small image are never refused because big uploads hold the budget; it is shared by the bytes
# beyond. What small bodies add past the budget is bounded by connections x 1 MiB, not by body sizes.
SMALL_BODY_BYTES = 1 << 20
# What a refused client is told to wait: an upload in flight takes seconds to finish and free its bytes.
BODY_BUDGET_RETRY_AFTER = 5


class BodyBudget:
    """A shared count of request body bytes in flight, and its ceiling. ``take`` is all or nothing."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._lock = threading.Lock()  # one app may be served from several threads' loops (tests do)

    def take(self, size: int, held_after: int) -> bool:
        """Count ``size`` more bytes of a request that holds ``held_after`` bytes with them; False (and
        nothing counted) where they would pass the ceiling and the request is past its small allowance."""
        with self._lock:
            if held_after > SMALL_BODY_BYTES and self.in_flight + size > self.limit:
                return False
            self.in_flight += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.in_flight -= size


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
    route its own cap (a batch file upload is bigger than any one request). 503 ``server_busy`` (with
    ``Retry-After``) for a body whose next chunk would take the bytes held by all requests past ``budget``
    (see BODY_BUDGET_MULTIPLE); a request's bytes are given back when it finishes, however it finishes."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 60.0,
                 path_caps: dict[str, int] | None = None, budget: BodyBudget | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.path_caps = path_caps or {}
        # One per app, and an app is one per process (a LiveServer in tests): the process-wide budget.
        self.budget = budget or BodyBudget(max(BODY_BUDGET_MULTIPLE * max_bytes, *self.path_caps.values()))

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
        held = 0  # of ``seen``, what this request has counted against the budget
        complete = False
        deadline = asyncio.get_running_loop().time() + self.timeout
        tripped: BodyTimeout | PayloadTooLarge | ServiceUnavailable | None = None
        started = False
        budget = self.budget

        async def counted_receive() -> Message:
            nonlocal seen, held, complete, tripped
            if tripped is not None:  # a route that swallowed the refusal reads no further
                raise tripped
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
                size = len(msg.get("body", b""))
                seen += size
                if seen > cap:
                    tripped = PayloadTooLarge(message, headers={"Connection": "close"})
                elif size and not budget.take(size, seen):
                    tripped = ServiceUnavailable(
                        "the server is receiving too many large request bodies at once; retry in "
                        f"{BODY_BUDGET_RETRY_AFTER}s", code="server_busy",
                        headers={"Retry-After": str(BODY_BUDGET_RETRY_AFTER), "Connection": "close"})
                    record(rejected="body_budget")
                else:
                    held += size
                complete = not msg.get("more_body", False)
                if tripped is not None:
                    raise tripped  # the rest is drained once the route has let go of what it read
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
        except (BodyTimeout, PayloadTooLarge, ServiceUnavailable) as exc:
            if exc is not tripped or started:
                raise
        finally:  # answered, failed, cancelled or the client gone: the body is no longer held
            budget.give(held)
            held = 0
        if tripped is not None and not started:
            # Given back before the drain: a refused upload that the client is still sending (seconds, for a
            # slow one) must not keep others from the budget, or under a flood every upload is refused.
            if not complete and not isinstance(tripped, BodyTimeout):
                await drain(receive)  # read and dropped, never counted
            headers = [(name.lower().encode("latin-1"), value.encode("latin-1"))
                       for name, value in tripped.headers.items()]
            await send_json_error(send, tripped.status, tripped.message, tripped.code, type_=tripped.type,
                                  headers=headers)
