"""A multipart upload read whole or refused: Starlette's parser drops a part the body cuts off (a client that
died mid-upload, a proxy's limit), so a cut body read as fewer pages or a shorter JSONL file, answered 200."""

from __future__ import annotations

from fastapi import Request
from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.types import Message

from ..errors import HyocrError, InvalidRequest

# Past the closing delimiter a body may carry an epilogue (RFC 2046), which clients do not send; kept this much.
_TAIL = 4096


async def read_form(request: Request, *, max_files: int, max_fields: int) -> FormData:
    """The request's multipart form, its parser's failures as 400s in the API's shape."""
    tail = bytearray()

    async def receive() -> Message:
        message = await request.receive()
        if message["type"] == "http.request":
            tail.extend(message.get("body", b""))
            del tail[:-_TAIL]
        return message

    try:
        form = await Request(request.scope, receive).form(max_files=max_files, max_fields=max_fields)
    except HyocrError:
        raise
    except HTTPException as exc:  # Starlette's own multipart limits ("Too many files ...")
        raise InvalidRequest(f"invalid multipart body: {exc.detail}") from None
    except Exception:  # noqa: BLE001 - malformed multipart: the parser's errors share no base
        raise InvalidRequest("could not parse the multipart body") from None
    # the boundary as the parser read it (its own header parser)
    boundary = parse_options_header(request.headers.get("content-type", ""))[1].get(b"boundary")
    if not boundary or b"--" + boundary + b"--" not in tail:
        await form.close()
        raise InvalidRequest("the multipart body ends before its closing boundary: the upload was cut short",
                             param="file")
    return form
