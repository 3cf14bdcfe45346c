"""Abort work for clients that hang up before a (non-streaming) answer is ready.

Streaming responses notice a disconnect on their own (the stream is closed). A plain JSON request
would otherwise keep the engine busy for a client that is gone, and a retrying client would pile up
copies of the same slow request: here the work is cancelled when the connection closes, which
closes its engine streams and so aborts the engine requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from ..errors import HyocrError

T = TypeVar("T")


class ClientDisconnected(HyocrError):
    status = 499  # nginx's "client closed request": never delivered, but logged and counted
    type = "client_closed"
    public = True


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():  # cancelled by the hang-up, not by the server
            raise ClientDisconnected("the client closed the connection") from None
        raise
    finally:
        watcher.cancel()
