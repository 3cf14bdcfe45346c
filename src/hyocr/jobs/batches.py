"""Batches: what the /v1/batches routes call, and how a batch input file becomes lines.

OpenAI's Batch API on the jobs layer. ``create`` checks what it can at once (the input file is the caller's
and of purpose batch, its line count within BATCH_MAX_LINES, the endpoint, the window, metadata, an output
URI the server may write): those are 4xx answers. The file itself is read by the runner (status
``validating``), as OpenAI does: a file whose requests cannot be told apart (a duplicate ``custom_id``), that
is empty or has too many requests, fails the batch with ``errors.data``; any other bad line (not JSON, no
``custom_id``, a method other than POST, a url that is not the batch's endpoint, no body object, longer than
``line_max_bytes``) becomes that line's error line, never a lost one. A line's body is checked when it
runs, by the online route's own models, so its error line carries the message the route would answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest, NotFound, RateLimited
from ..pipeline.objects import ObjectStore, is_object_uri
from .batch_store import BatchRecord, BatchStore
from .files import FileStore, utf8_only

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/ocr")
WINDOW = "24h"
WINDOW_SECONDS = 86_400.0
MAX_CUSTOM_ID = 512
MAX_REPORTED = 100  # errors.data entries kept for a failed validation


@dataclass(frozen=True, slots=True)
class Line:
    """One non-blank input line: its request (``request``, the body as JSON), or the error line it is."""

    n: int
    custom_id: str | None
    request: bytes | None = None
    error: tuple[str, str, str | None] | None = None  # (code, message, param)


def error_line(custom_id: str | None, code: str, message: str, *, status_code: int | None = None,
               request_id: str | None = None, body: dict | None = None) -> dict:
    """An output line for a request that failed: ``response`` null when it never reached its endpoint, the
    endpoint's error answer otherwise; ``error`` says why in both cases."""
    response = None if status_code is None else {"status_code": status_code, "request_id": request_id,
                                                 "body": body}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response,
            "error": {"code": code, "message": message}}


def line_max_bytes(settings) -> int:
    """The longest input line: one MAX_IMAGE_BYTES image as base64 and 1 MiB of JSON, within MAX_BODY_BYTES
    (a line is a request, held to what the online route would take)."""
    return min(settings.max_body_bytes, -(-settings.max_image_bytes // 3) * 4 + 1024**2)


def parse_line(n: int, raw: bytes, endpoint: str, max_line_bytes: int = 0) -> Line:
    """A line of the input file (``TooLong``: it was longer than the cap) as a request or an error."""
    if isinstance(raw, TooLong):
        why = f"line {n} is longer than {max_line_bytes} bytes (a MAX_IMAGE_BYTES image as base64 and 1 MiB)"
        return Line(n, _custom_id_in(raw), error=("line_too_large", why, None))
    try:
        item = json.loads(raw)
    except RecursionError:
        return Line(n, _custom_id_in(raw), error=("invalid_json_line", f"line {n} nests too deeply", None))
    except ValueError as exc:  # UnicodeDecodeError included
        why = f"line {n} is not valid JSON" + (" (an integer over 4300 digits)" if "digits" in str(exc) else "")
        return Line(n, _custom_id_in(raw), error=("invalid_json_line", why, None))
    if not isinstance(item, dict):
        return Line(n, None, error=("invalid_json_line", f"line {n} is not a JSON object", None))
    custom_id = item.get("custom_id")
    if not _is_custom_id(custom_id):
        why = f"line {n}: custom_id must be a string of 1 to {MAX_CUSTOM_ID} printable characters"
        return Line(n, None, error=("missing_custom_id", why, "custom_id"))
    method, url, body = item.get("method"), item.get("url"), item.get("body")
    if method != "POST":
        return Line(n, custom_id, error=("invalid_method", f"line {n}: method must be POST", "method"))
    if url != endpoint:
        shown = url[:80] if isinstance(url, str) else url
        why = f"line {n}: url {shown!r} is not this batch's endpoint {endpoint} (every line goes to it)"
        return Line(n, custom_id, error=("invalid_url", why, "url"))
    if not isinstance(body, dict):
        return Line(n, custom_id, error=("invalid_body", f"line {n}: body must be a JSON object", "body"))
    # escaped to ASCII: any string JSON can carry (a lone surrogate too) is stored as the line gave it
    return Line(n, custom_id, json.dumps(body, separators=(",", ":")).encode())


_CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"((?:[^"\\\x00-\x1f]|\\.){1,%d})"' % MAX_CUSTOM_ID)


def _custom_id_in(raw: bytes) -> str | None:
    """The custom_id of a line that does not parse, where its first KiB names one plainly (as its answer's
    key, so the caller can match the error line back); None otherwise."""
    found = _CUSTOM_ID.search(raw[:HEAD_BYTES])
    if found is None:
        return None
    try:
        value = json.loads(b'"' + found.group(1) + b'"')
    except ValueError:
        return None
    return value if _is_custom_id(value) else None


def _is_custom_id(value: object) -> bool:
    """A string of 1 to MAX_CUSTOM_ID printable characters that UTF-8 can hold: it names the line in the
    output files, object keys and the database (PostgreSQL text holds no NUL)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CUSTOM_ID or not value.isprintable():
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class TooLong(bytes):
    """The first KiB of an input line longer than the cap, the rest skipped: only its custom_id is looked for."""


HEAD_BYTES = 1024


async def split_lines(parts: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[tuple[int, bytes]]:
    """(line number from 1, its bytes) of every non-blank line of ``parts``; a line longer than ``max_bytes``
    comes as ``TooLong`` (its first KiB), the rest of its bytes skipped, not kept."""
    n, held, too_long, head = 0, bytearray(), False, b""

    def done() -> tuple[int, bytes] | None:
        if too_long:
            return n, TooLong(head or held[:HEAD_BYTES])
        line = bytes(held).rstrip(b"\r")
        return (n, line) if line.strip() else None

    # an object-store input file is first read here (an upload was checked as it came)
    async for data in utf8_only(parts, param="input_file_id"):
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if not too_long:
                held += data[start:end]
                too_long = len(held) > max_bytes
            n += 1
            if (item := done()) is not None:
                yield item
            held.clear()
            too_long, head = False, b""
            start = end + 1
        if not too_long:
            held += data[start:]
            if len(held) > max_bytes:
                too_long, head = True, bytes(held[:HEAD_BYTES])
                held.clear()
    if held or too_long:
        n += 1
        if (item := done()) is not None:
            yield item


class Batches:
    def __init__(self, store: BatchStore, files: FileStore, objects: ObjectStore, settings) -> None:
        self.store = store
        self.files = files
        self.objects = objects
        self.settings = settings
        self.wake = None  # the runner's wake event, set by Jobs
        # One create at a time per caller in this process: the caps are counted, then the batch stored (creates
        # sent together each passed the count otherwise: 5 active batches under a cap of 2). Several API processes
        # or replicas can still each pass it once, as job submits can (jobs/service.py).
        self._creating: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def create(self, owner: str, *, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict | None, output_uri: str | None,
                     output_expires_after: dict | None) -> BatchRecord:
        if endpoint not in ENDPOINTS:
            raise InvalidRequest(f"endpoint {endpoint[:80]!r} is not supported: use one of "
                                 f"{', '.join(ENDPOINTS)}", param="endpoint", code="invalid_endpoint")
        if completion_window != WINDOW:
            raise InvalidRequest(f"completion_window must be {WINDOW!r}", param="completion_window")
        _check_metadata(metadata)
        keep = _expires_after(output_expires_after)
        size = 0  # an object's size is known once read: validation counts it
        if is_object_uri(input_file_id):
            input_file_id = str(self.objects.checked(input_file_id, param="input_file_id"))
        else:
            size = (await self._check_file(owner, input_file_id)).bytes
        if output_uri is not None:
            output_uri = str(self.objects.checked(output_uri, param="output_uri", prefix=True))
        async with self._creating.setdefault(owner, asyncio.Lock()):
            await self._within_caps(owner, size)
            batch = await self.store.create(owner=owner, endpoint=endpoint, input_file_id=input_file_id,
                                            completion_window=completion_window, metadata=metadata,
                                            output_uri=output_uri, output_expires_after=keep,
                                            window=WINDOW_SECONDS)
        if self.wake is not None:
            self.wake.set()
        return batch

    async def _within_caps(self, owner: str, size: int) -> None:
        """JOB_MAX_ACTIVE batches per caller; and a batch's requests are copied from its input file into its
        lines, so they count toward JOB_MAX_STORED_BYTES beside the caller's files while it runs (one file made
        a thousand batches' copies past the cap)."""
        if (active := await self.store.active(owner)) >= self.settings.job_max_active:
            raise RateLimited(f"{active} of your batches are active, the most this server keeps per caller; "
                              "create more as they finish", code="too_many_batches",
                              headers={"Retry-After": "10"})
        held, validating = await self.store.held_bytes(owner)
        held += await self.files.stored(owner)
        for file_id in validating:  # their lines are still being copied: counted whole
            if not is_object_uri(file_id) and (found := await self.files.get(owner, file_id)) is not None:
                held += found.bytes
        room = self.settings.job_max_stored_bytes
        if held + size > room:
            raise RateLimited(f"your files and the requests of your active batches hold {held} bytes; this batch's "
                              f"requests ({size} bytes) would pass the {room} bytes kept per caller: create it as "
                              "others finish", code="too_many_batch_bytes", headers={"Retry-After": "60"})

    async def _check_file(self, owner: str, file_id: str):
        found = await self.files.get(owner, file_id)
        if found is None:  # another caller's file is not found either
            raise NotFound(f"no file {file_id[:80]!r}", param="input_file_id", code="file_not_found")
        if found.purpose != "batch":
            raise InvalidRequest(f"file {file_id} has purpose {found.purpose!r}; a batch reads a file "
                                 "uploaded with purpose 'batch'", param="input_file_id", code="invalid_file")
        if not found.lines:
            raise InvalidRequest(f"file {file_id} has no requests", param="input_file_id", code="empty_file")
        if found.lines > self.settings.batch_max_lines:
            raise InvalidRequest(f"file {file_id} has {found.lines} requests; a batch takes at most "
                                 f"{self.settings.batch_max_lines}: split it", param="input_file_id",
                                 code="batch_too_large")
        return found

    async def get(self, owner: str, batch_id: str) -> BatchRecord:
        batch = await self.store.get(owner, batch_id)
        if batch is None:
            raise NotFound(f"no batch {batch_id[:80]!r}", param="batch_id", code="batch_not_found")
        return batch

    async def list(self, owner: str, *, limit: int, after: str | None) -> tuple[list[BatchRecord], bool]:
        return await self.store.list(owner, limit=limit, after=after)

    async def cancel(self, owner: str, batch_id: str) -> BatchRecord:
        """validating or in_progress -> cancelling (the runner stops its lines and ends it cancelled); a batch
        cancelling or ended is returned as it is."""
        await self.get(owner, batch_id)
        if await self.store.cancel(owner, batch_id) and self.wake is not None:
            self.wake.set()
        return await self.get(owner, batch_id)


def _check_metadata(metadata: Any) -> None:
    """OpenAI's rule: at most 16 pairs, keys up to 64 characters, string values up to 512."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise InvalidRequest("metadata must be an object of at most 16 pairs", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise InvalidRequest("metadata keys are at most 64 characters, values strings of at most 512",
                                 param=f"metadata.{key[:64]}")


def _expires_after(given: Any) -> int | None:
    if given is None:
        return None
    if not isinstance(given, dict) or given.get("anchor") != "created_at":
        raise InvalidRequest("output_expires_after needs anchor 'created_at' and seconds",
                             param="output_expires_after")
    seconds = given.get("seconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 3600 <= seconds <= 2_592_000:
        raise InvalidRequest("output_expires_after.seconds must be 3600 to 2592000",
                             param="output_expires_after.seconds")
    return seconds
